"""The vLLM version the emulator imitates, and its `system_fingerprint`."""

from __future__ import annotations

import functools
import hashlib

import msgspec

from usage_ledger.emulator.config import EmulatorConfig

__all__ = ("VLLM_VERSION", "system_fingerprint")

VLLM_VERSION = "0.32.0"


@functools.lru_cache(maxsize=16)
def system_fingerprint(config: EmulatorConfig) -> str:
    """vLLM's default (`--fingerprint-mode full`, no parallelism): `vllm-<version>-<8 hex of the config hash>`."""
    return f"vllm-{VLLM_VERSION}-{hashlib.blake2b(msgspec.json.encode(config), digest_size=4).hexdigest()}"
