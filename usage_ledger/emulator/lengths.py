"""How many tokens a request generates, and why it stops (deterministic, vLLM's rules)."""

from __future__ import annotations

import hashlib

__all__ = ("natural_length", "output_plan")


def natural_length(key: bytes, mean: int, spread: float) -> int:
    """A length drawn uniformly from mean*(1 +- spread), fixed by `key` (e.g. the prompt)."""
    u = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2.0**64
    return max(1, round(mean * (1.0 + spread * (2.0 * u - 1.0))))


def output_plan(
    *, natural: int, max_tokens: int | None, min_tokens: int, ignore_eos: bool, room: int
) -> tuple[int, str]:
    """(tokens to generate, finish_reason) for a request.

    `room` is what the context has left after the prompt. `ignore_eos` generates up to the
    limit; otherwise the natural length, raised to `min_tokens`, stops with "stop" unless the
    limit cuts it first ("length").
    """
    limit = room if max_tokens is None else min(max_tokens, room)
    if ignore_eos:
        return limit, "length"
    length = max(natural, min_tokens)
    if length >= limit:
        return limit, "length"
    return length, "stop"
