"""The one plausibility rule for a call's counts (tokens, and vLLM's per-request speculative-decoding counters).

A count is plausible when it is an integer (not a bool) from 0 to its field's bound (`COUNT_BOUNDS`). Where
it is applied and what an implausible count does (kept as received, enters no sum): docs/auditing.md,
`usage_source` `implausible`.

Why 2³¹ − 1 per call: the longest context window of any served model is ~10⁷ tokens, so the bound is
two orders of magnitude above anything a real call can count, and a reported count above it is a
broken upstream or a forged file, not a call. It also keeps every sum exact: 2³¹ calls of the bound
each sum to under 2⁶² (and 2³² of them under 2⁶³), inside SQLite's INTEGER and PostgreSQL's BIGINT,
so no report, page or export can overflow on ledgers of any size this product will hold.
"""

from __future__ import annotations

from typing import Any

from usage_ledger.ledger.events import Usage

__all__ = ("COUNT_BOUNDS", "MAX_CALL_TOKENS", "count_problem", "plausible_count", "usage_problem")

MAX_CALL_TOKENS = 2**31 - 1
"""The most tokens one call can plausibly count in any one field (the module's docstring says why)."""

COUNT_BOUNDS: dict[str, int] = {
    # the server's usage (chat, completions, embeddings; the Responses API's names alike)
    "prompt_tokens": MAX_CALL_TOKENS,
    "completion_tokens": MAX_CALL_TOKENS,
    "cached_tokens": MAX_CALL_TOKENS,
    "total_tokens": 2 * MAX_CALL_TOKENS,  # prompt + completion
    # `ledger import`'s columns
    "input_tokens": MAX_CALL_TOKENS,
    "output_tokens": MAX_CALL_TOKENS,
    # vLLM's per-request `speculative_decoding` block: each step drafts a handful of tokens for one output token
    "num_draft_tokens": MAX_CALL_TOKENS,
    "num_accepted_draft_tokens": MAX_CALL_TOKENS,
    "num_spec_steps": MAX_CALL_TOKENS,
}
"""The largest plausible value of each count field; the smallest is 0."""


def plausible_count(field: str, value: Any) -> bool:
    """Whether `value` is a plausible count for `field` (a key of `COUNT_BOUNDS`)."""
    return type(value) is int and 0 <= value <= COUNT_BOUNDS[field]


def count_problem(field: str, value: Any) -> str:
    """Why `value` is not a plausible `field` count, in words; "" when it is."""
    if plausible_count(field, value):
        return ""
    if type(value) is not int:
        return f"{field} {value!r:.40} is not a whole number"
    if value < 0:
        return f"{field} {value} is negative"
    return f"{field} {value} is above the plausible {COUNT_BOUNDS[field]:,} per call"


def usage_problem(usage: Usage) -> str:
    """Why a usage's counts are not all plausible (each implausible one named); "" when they are."""
    counts = [
        ("prompt_tokens", usage.prompt_tokens),
        ("completion_tokens", usage.completion_tokens),
        ("total_tokens", usage.total_tokens),
    ]
    if usage.cached_tokens is not None:
        counts.append(("cached_tokens", usage.cached_tokens))
    return "; ".join(problem for field, value in counts if (problem := count_problem(field, value)))
