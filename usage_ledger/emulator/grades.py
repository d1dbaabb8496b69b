"""The grade line (`EmulatorConfig.grade_line`): an answer that begins `Grade: Hold`, like the user's pipeline's.

How the labels are drawn, and why the shares and `LEANING` are what they are: docs/emulator.md ("The grade line").
"""

from __future__ import annotations

import bisect
import hashlib
import itertools

__all__ = ("GRADE_SCALE", "GRADE_WEIGHTS", "LEANING", "grade_of")

GRADE_SCALE = ("Strong Sell", "Sell", "Hold", "Buy", "Strong Buy")
"""Lowest first, as `ledger agreement --scale` / `ledger decide --scale` take it."""
GRADE_WEIGHTS = (0.03, 0.09, 0.76, 0.09, 0.03)
"""The share of each label (docs/decide-example's distribution, Hold-heavy like the user's grades)."""
LEANING = 0.35
"""How often a label is the model's seed-independent leaning: sets the self-agreement (kappa ≈ LEANING²)."""
_CUMULATIVE = tuple(itertools.accumulate(GRADE_WEIGHTS))


def _uniform(*parts: bytes) -> float:
    """A number in [0, 1) fixed by `parts`."""
    digest = hashlib.blake2b(b"\0".join(parts), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _label(u: float) -> str:
    return GRADE_SCALE[min(bisect.bisect_right(_CUMULATIVE, u * _CUMULATIVE[-1]), len(GRADE_SCALE) - 1)]


def grade_of(model: str, seed: int, prompt: bytes) -> str:
    """The label of the answer to `prompt` (with the choice's index in it for n > 1) by `model` under `seed`."""
    name, drawn = model.encode(), str(seed).encode()
    if _uniform(b"follows", name, drawn, prompt) < LEANING:
        return _label(_uniform(b"leaning", name, prompt))
    return _label(_uniform(b"draw", name, drawn, prompt))
