"""One imported row's fields validated into a `call.imported` body (the rules: `imports.importer`)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from usage_ledger.ledger import CallImported, count_problem

__all__ = ("RowError", "parse_record")

_KNOWN = frozenset(
    {
        "started_at",
        "finished_at",
        "elapsed_s",
        "input_tokens",
        "output_tokens",
        "run",
        "ticker",
        "model",
        "ttft_s",
        "status",
        "tags",
        "call_id",
        "finish_reason",
    }
)
_MAX_TEXT = 255


class RowError(ValueError):
    """One invalid row: the reason (the caller adds `file:line`)."""


def _time(value: Any, field: str, text_numbers: bool = True) -> datetime:
    if isinstance(value, bool):
        raise RowError(f"{field}: expected ISO 8601 with offset or epoch seconds, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise RowError(f"{field}: epoch seconds must be finite")
        try:
            return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=value)
        except OverflowError:
            raise RowError(f"{field}: epoch seconds {value!r} out of range") from None
    if not isinstance(value, str):
        raise RowError(f"{field}: expected ISO 8601 with offset or epoch seconds, got {type(value).__name__}")
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not text_numbers:
            raise RowError(f"{field}: epoch seconds must be a JSON number, not the string {value!r} (drop the quotes)")
        return _time(seconds, field)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise RowError(f"{field}: {value!r} is neither ISO 8601 nor epoch seconds") from None
    if parsed.tzinfo is None:
        raise RowError(f"{field}: {value!r} has no UTC offset (add Z or +09:00, or give epoch seconds)")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise RowError(f"{field}: {value!r} is before 0001-01-01 or after 9999-12-31 in UTC") from None


def _count(value: Any, field: str, text_numbers: bool = True) -> int:
    if isinstance(value, str) and not text_numbers:
        raise RowError(f"{field}: expected a whole number, got the string {value!r} (drop the quotes)")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise RowError(f"{field}: expected a whole number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError(f"{field}: expected a whole number, got {value!r}")
    if value < 0:
        raise RowError(f"{field}: must be >= 0, got {value}")
    return value


def _seconds(value: Any, field: str, text_numbers: bool = True) -> float:
    if isinstance(value, str) and not text_numbers:
        raise RowError(f"{field}: expected seconds as a number, got the string {value!r} (drop the quotes)")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise RowError(f"{field}: expected seconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RowError(f"{field}: expected seconds, got {value!r}")
    if value < 0:
        raise RowError(f"{field}: must be >= 0, got {value}")
    return float(value)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise RowError(f"{field}: expected a string, got {type(value).__name__}")
    if not value or len(value) > _MAX_TEXT or any(ord(ch) < 32 for ch in value):
        raise RowError(f"{field}: must be 1-{_MAX_TEXT} characters without control characters")
    return value


def parse_record(
    fields: dict[str, Any], *, source: str, line: int, event_id: uuid.UUID, from_text: bool = False
) -> CallImported:
    """Validate one row's fields into a `call.imported` body.

    JSON values must have their JSON types (`"input_tokens": "12"` is refused); `from_text` (CSV,
    where every cell is text) parses numbers from strings, still refusing non-integer counts.
    """
    unknown = sorted(set(fields) - _KNOWN)
    if unknown:
        raise RowError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    for required in ("started_at", "input_tokens", "output_tokens"):
        if fields.get(required) is None:
            raise RowError(f"missing required field {required}")
    started = _time(fields["started_at"], "started_at", from_text)
    finished_raw, elapsed_raw = fields.get("finished_at"), fields.get("elapsed_s")
    if finished_raw is None and elapsed_raw is None:
        raise RowError("missing finished_at or elapsed_s (one is required)")
    finished = _time(finished_raw, "finished_at", from_text) if finished_raw is not None else None
    if elapsed_raw is not None:
        elapsed = _seconds(elapsed_raw, "elapsed_s", from_text)
        try:
            by_elapsed = started + timedelta(seconds=elapsed)
        except OverflowError:
            raise RowError(f"elapsed_s: {elapsed:g} s after started_at is past 9999-12-31") from None
        if finished is not None and abs((finished - by_elapsed).total_seconds()) > 0.001:
            raise RowError("finished_at and elapsed_s disagree (give one of them)")
        finished = finished or by_elapsed
    assert finished is not None
    if finished < started:
        raise RowError("finished_at is before started_at")
    tags_raw = fields.get("tags") or {}
    if not isinstance(tags_raw, dict):
        raise RowError("tags: expected an object of string values")
    tags = {_text(k, "tags").lower(): _text(v, f"tags.{k}") for k, v in tags_raw.items()}
    ticker = fields.get("ticker")
    if ticker is not None:
        ticker = _text(ticker, "ticker")
        if tags.get("ticker", ticker) != ticker:
            raise RowError("ticker and tags.ticker disagree")
        tags["ticker"] = ticker
    status_raw = fields.get("status") or "ok"
    if status_raw not in ("ok", "error"):
        raise RowError(f"status: expected ok or error, got {status_raw!r}")
    status: Literal["ok", "error"] = "ok" if status_raw == "ok" else "error"
    ttft = _seconds(fields["ttft_s"], "ttft_s", from_text) if fields.get("ttft_s") is not None else None
    if ttft is not None and ttft > (finished - started).total_seconds() + 0.001:
        raise RowError(f"ttft_s ({ttft:g} s) is longer than the call ({(finished - started).total_seconds():g} s)")
    call_id = fields.get("call_id")
    input_tokens = _count(fields["input_tokens"], "input_tokens", from_text)
    output_tokens = _count(fields["output_tokens"], "output_tokens", from_text)
    implausible = "; ".join(
        p for f, v in (("input_tokens", input_tokens), ("output_tokens", output_tokens)) if (p := count_problem(f, v))
    )
    return CallImported(
        call_id=_text(call_id, "call_id") if call_id is not None else f"imp-{event_id.hex}",
        source=source,
        line=line,
        started_at=started,
        finished_at=finished,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        usage_source="implausible" if implausible else "imported",
        usage_detail=implausible,
        run=_text(fields["run"], "run") if fields.get("run") is not None else None,
        tags=tags,
        model=_text(fields["model"], "model") if fields.get("model") is not None else None,
        ttft_s=ttft,
        status=status,
        finish_reason=_text(fields["finish_reason"], "finish_reason")
        if fields.get("finish_reason") is not None
        else None,
    )
