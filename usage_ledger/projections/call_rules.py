"""The calls read model's rules, each written once for both of its builders.

`call_fold.fold_call` applies them in Python (the follower, and the calls a rebuild cannot load in bulk);
the bulk rebuild runs them as SQL on both backends, spliced in by `call_sql`. A rule of values
(`FINISHED_STATUS`, `ENDED_AT`, `PREFILL_TPS`, `DECODE_TPS`) is one `rule_expr` expression, made into both
its SQL and its Python function; `DURATIONS` names the moments each duration spans for both, and the
statuses and `NO_USAGE` are the values both write where a call has no end, or no usage. What a
speculative-decoding counter must be is written twice, side by side (`spec_decode_counts` over the parsed
value here, `call_sql.PayloadSQL.is_count` over the stored JSON text, bound by `SPEC_COUNT_DIGITS`). A rule
changed here changes for every builder; the digest property tests (tests/projections/test_rebuild_properties.py)
hold the Python and the SQL to the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from usage_ledger.projections.rule_expr import all_of, case, coalesce, differs, value

__all__ = (
    "CALL_STATUSES",
    "DECODE_TPS",
    "DURATIONS",
    "ENDED_AT",
    "FAILED_END_STATUS",
    "FAILED_STATUSES",
    "FINISHED_STATUS",
    "NO_END_STATUS",
    "NO_USAGE",
    "PREFILL_TPS",
    "SPEC_COUNT_DIGITS",
    "SPEC_DECODE_KEYS",
    "TIMESTAMP_SHAPES",
    "decode_rate_note",
    "decode_tps",
    "ended_at",
    "finished_status",
    "prefill_tps",
    "spec_decode_counts",
    "timestamp_shapes",
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

_HTTP_STATUS = value("http_status")

FINISHED_STATUS = case((all_of(_HTTP_STATUS >= 200, _HTTP_STATUS < 400), "ok"), otherwise="error")
"""A call the upstream answered: `ok` for 2xx and 3xx (what a client takes for success), else `error`."""

finished_status: Callable[[int], str] = FINISHED_STATUS.python("http_status")
"""`FINISHED_STATUS` of an HTTP status, in Python."""

TIMESTAMP_SHAPES = ("????-??-??T??:??:??Z", "????-??-??T??:??:??.??????Z")
"""The two shapes msgspec writes a UTC datetime in (whole seconds; microseconds), `?` one character:
the bulk SQL reads a stored moment only in these (any other shape makes the call not plain, and the
Python fold reads it)."""


def timestamp_shapes(one_char: str) -> tuple[str, str]:
    """`TIMESTAMP_SHAPES` as patterns whose one-character wildcard is `one_char` (`_` for LIKE)."""
    whole, fraction = (shape.replace("?", one_char) for shape in TIMESTAMP_SHAPES)
    return whole, fraction


ENDED_AT = coalesce(value("finished"), value("last_token"), value("headers"), value("received"))
"""When a call ended: its final event's moment, else the last thing seen of it."""

_Moment = datetime | None

ended_at: Callable[[_Moment, _Moment, _Moment, datetime], datetime] = ENDED_AT.python(
    "finished", "last_token", "headers", "received"
)
"""`ENDED_AT` of an end's moments (finished, last token, upstream headers, received), in Python."""

_INPUT_TOKENS, _OUTPUT_TOKENS, _TTFT_S, _DECODE_S = map(value, ("input_tokens", "output_tokens", "ttft_s", "decode_s"))

PREFILL_TPS = case((all_of(_TTFT_S > 0, differs(_INPUT_TOKENS, 0)), _INPUT_TOKENS / _TTFT_S))
"""Prompt tokens over the time to the first token."""

DECODE_TPS = case((all_of(_DECODE_S > 0, _OUTPUT_TOKENS > 1), (_OUTPUT_TOKENS - 1) / _DECODE_S))
"""Tokens after the first over the time from the first to the last token (one token: no interval)."""

prefill_tps: Callable[[int, float | None], float | None] = PREFILL_TPS.python("input_tokens", "ttft_s")
"""`PREFILL_TPS` of (input tokens, TTFT s), in Python."""

decode_tps: Callable[[int, float | None], float | None] = DECODE_TPS.python("output_tokens", "decode_s")
"""`DECODE_TPS` of (output tokens, decode s), in Python."""


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

SPEC_COUNT_DIGITS = 15
"""A counter is kept when it is a JSON integer of at most this many digits (0 ≤ n < 10¹⁵): what
both backends' SQL can tell from the stored text and BIGINT holds."""


def spec_decode_counts(block: Any) -> tuple[int, int, int] | None:
    """(draft tokens, accepted draft tokens, spec steps) of the `speculative_decoding` block of a call's
    `request_metrics`, as vLLM sent it; None unless it holds all three as non-negative integers (booleans are not)."""
    if not isinstance(block, dict):
        return None
    draft, accepted, steps = (_spec_count(block.get(key)) for key in SPEC_DECODE_KEYS)
    if draft is None or accepted is None or steps is None:
        return None
    return draft, accepted, steps


def _spec_count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 10**SPEC_COUNT_DIGITS else None


DURATIONS = (
    ("elapsed_s", "ended_at", "started_at"),
    ("ttft_s", "first_token_at", "started_at"),
    ("decode_s", "last_token_at", "first_token_at"),
)
"""A call's durations, each the seconds from the later of two of its row's moments back to the earlier
(`call_fold._derive` and `row_sql` compute them); `decode_s` is not a column, `DECODE_TPS` divides by it."""
