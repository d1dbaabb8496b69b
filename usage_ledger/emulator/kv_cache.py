"""vLLM's KV block pool reduced to counts: how many blocks each running sequence holds.

What a sequence holds and when it gives its blocks back: docs/emulator.md (`vllm:kv_cache_usage_perc`).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ("BlockHolder", "KVBlockPool")


class BlockHolder(Protocol):
    blocks: int


class KVBlockPool:
    __slots__ = ("block_size", "num_blocks", "used")

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used = 0

    @property
    def usage(self) -> float:
        """Share of the pool held by sequences, 0..1."""
        return self.used / self.num_blocks

    def reserve(self, holder: BlockHolder, tokens: int) -> bool:
        """Grow `holder` to hold `tokens`; False (nothing changed) when the pool lacks the blocks."""
        need = -(-tokens // self.block_size) - holder.blocks  # whole blocks, rounded up
        if need <= 0:
            return True
        if need > self.num_blocks - self.used:
            return False
        holder.blocks += need
        self.used += need
        return True

    def release(self, holder: BlockHolder) -> None:
        self.used -= holder.blocks
        holder.blocks = 0
