"""The calls read model's rules, each written once in plain Python: the fold (`call_fold`) and the readers
(reports, filters, the call view) call these functions and use these values."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from usage_ledger.ledger import plausible_count

__all__ = (
    "CALL_STATUSES",
    "FAILED_END_STATUS",
    "FAILED_STATUSES",
    "IMPLAUSIBLE",
    "NO_END_STATUS",
    "NO_USAGE",
    "SPEC_DECODE_KEYS",
    "TRUNCATED_REASONS",
    "decode_rate_note",
    "decode_tps",
    "ended_at",
    "finished_status",
    "plausible_tokens",
    "prefill_tps",
    "spec_decode_counts",
)

NO_END_STATUS = "incomplete"
"""The status of a call with no end recorded (yet, or ever)."""

FAILED_END_STATUS = "failed"
"""The status of a call whose end is `call.failed`: it broke off before the upstream's answer was whole
(upstream unreachable, timed out or reset, an error in its stream, the client gone, a gateway error)."""

FAILED_STATUSES = ("error", FAILED_END_STATUS)
"""The statuses of calls that did not succeed."""

CALL_STATUSES = ("ok", *FAILED_STATUSES, NO_END_STATUS)
"""Every status a call row can have."""

NO_USAGE = "absent"
"""The `usage_source` of a call without usage: the events' own default (`ledger.events`), and a row's
without an end. Its tokens are then 0, never invented."""


TRUNCATED_REASONS = ("length", "max_output_tokens")
"""The finish reasons of an answer cut at its token limit: chat and completions' `length`, the Responses
API's `incomplete_details.reason` `max_output_tokens`. A batch that parses answers loses what was cut."""


def finished_status(http_status: int) -> str:
    """A call the upstream answered: `ok` for 2xx and 3xx (what a client takes for success), else `error`."""
    return "ok" if 200 <= http_status < 400 else "error"


def ended_at(
    finished: datetime | None, last_token: datetime | None, headers: datetime | None, received: datetime
) -> datetime:
    """When a call ended: its final event's moment, else the last thing seen of it."""
    if finished is not None:
        return finished
    if last_token is not None:
        return last_token
    return headers if headers is not None else received


def prefill_tps(input_tokens: int, ttft_s: float | None) -> float | None:
    """Prompt tokens over the time to the first token."""
    if ttft_s is None or ttft_s <= 0 or input_tokens == 0:
        return None
    return input_tokens / ttft_s


def decode_tps(output_tokens: int, decode_s: float | None) -> float | None:
    """Tokens after the first over the time from the first to the last token (one token: no interval)."""
    if decode_s is None or decode_s <= 0 or output_tokens <= 1:
        return None
    return (output_tokens - 1) / decode_s


def decode_rate_note(
    decode_tps: float | None, output_tokens: int, first: datetime | None, last: datetime | None
) -> str | None:
    """Why a call has no decode rate (`decode_tps`'s rule, in words); None when it has one."""
    if decode_tps is not None:
        return None
    if output_tokens <= 1:
        return "at most one output token: no decode interval"
    if first is None or last is None:
        return "no token timings (not a stream, or no token arrived)"
    if last <= first:
        return "every token arrived in one read: no decode interval to divide by"
    return None  # pragma: no cover - decode_tps gives a rate in every other case


SPEC_DECODE_KEYS = ("num_draft_tokens", "num_accepted_draft_tokens", "num_spec_steps")
"""The counters of vLLM's per-request `speculative_decoding` block the calls read model keeps, in the
order of its columns `spec_draft_tokens`, `spec_accepted_tokens`, `spec_steps`."""

IMPLAUSIBLE = "implausible"
"""The `usage_source` of a row whose event holds a token count outside the plausibility rule
(`ledger.counts`): that count is 0 in the row (`cached_tokens`: None), so it enters no sum."""


def plausible_tokens(field: str, value: Any) -> int | None:
    """A token count as the row keeps it: the value when plausible (`ledger.counts`), else None."""
    return value if plausible_count(field, value) else None


def spec_decode_counts(block: Any) -> tuple[int, int, int] | None:
    """(draft tokens, accepted draft tokens, spec steps) of the `speculative_decoding` block of a call's
    `request_metrics`, as vLLM sent it; None unless all three are plausible counts (`ledger.counts`)."""
    if not isinstance(block, dict):
        return None
    draft, accepted, steps = (plausible_tokens(key, block.get(key)) for key in SPEC_DECODE_KEYS)
    if draft is None or accepted is None or steps is None:
        return None
    return draft, accepted, steps
