"""The grade line (`EmulatorConfig.grade_line`): an answer that begins `Grade: Hold`, like the user's pipeline's.

Off by default. When on, every chat and completions choice's text starts with `Grade: <label>` on a
line of its own (then a blank line and the usual filler), as tokens of the answer: usage, lengths and
timing are unchanged. The label is on `GRADE_SCALE` and is deterministic: the same model, seed, prompt
and choice always give the same one; the seed is the request's `seed` (vLLM's sampling seed) or else
the emulator's `--seed`.

How the labels are drawn, to look like the user's repeated runs (DESIGN §7, docs/decide.md): every
label is drawn from `GRADE_WEIGHTS` (Hold 76 %, the user's runs had 71-80 %). With probability
`LEANING` it is the model's own leaning for the prompt, the same under every seed; otherwise a draw of
the seed's own. Two runs with different seeds then agree on about LEANING² + (1 − LEANING²) × Σ wᵢ²
≈ 64 % of keys, with a quadratic weighted kappa near LEANING² ≈ 0.12 (the user's three repetitions:
56-61 of 99, mean QWK 0.12); two models, whose leanings are independent, agree only by chance
(≈ 60 %, kappa ≈ 0). The answer says nothing true about the ticker: the grades are synthetic.
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
