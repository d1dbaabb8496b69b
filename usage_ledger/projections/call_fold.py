"""The calls read model's row and its fold: a pure function of the call's events in position order.

The only definition of a call's row: the follower, a rebuild and the OpenTelemetry export run it. A token
count outside the plausibility rule (`ledger.counts`) is 0 in the row with `usage_source` `implausible`,
so ledgers recorded before the rule heal on rebuild. Client text goes through `projections.text`."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import msgspec

from usage_ledger.ledger import CallRetagged
from usage_ledger.projections._slim import DECODERS, SFailed, SFinished, SImported, SStarted
from usage_ledger.projections.call_rules import (
    FAILED_END_STATUS,
    IMPLAUSIBLE,
    NO_END_STATUS,
    NO_USAGE,
    decode_tps,
    ended_at,
    finished_status,
    plausible_tokens,
    prefill_tps,
    spec_decode_counts,
)
from usage_ledger.projections.tables import calls
from usage_ledger.projections.text import projection_tags, projection_text, projection_text_or_none

__all__ = ("FRESH", "HANDLED", "CallRow", "decode_calls", "fold_calls")

FRESH = frozenset({"call.started", "call.imported"})
"""Event types that begin a call's row afresh (no stored row needs loading)."""
HANDLED = frozenset({*FRESH, "call.finished", "call.failed", "call.retagged"})
"""Event types the calls read model folds."""

_tags_encoder = msgspec.json.Encoder(order="sorted")
_tags_decoder = msgspec.json.Decoder(dict[str, str])


class CallRow(msgspec.Struct, kw_only=True, gc=False):
    """One row of `projection_calls`: the fields are its columns, in order (`Backend.write_rows` writes them so)."""

    version: int
    call_id: str
    run: str | None = None
    ticker: str | None = None
    tags: str = "{}"
    """The call's tags as sorted JSON."""
    model: str | None = None
    origin: str = "gateway"
    source: str | None = None
    status: str = NO_END_STATUS
    http_status: int | None = None
    failure_reason: str | None = None
    usage_source: str = NO_USAGE
    started_at: datetime
    first_token_at: datetime | None = None
    last_token_at: datetime | None = None
    ended_at: datetime | None = None
    elapsed_s: float | None = None
    ttft_s: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    spec_steps: int | None = None
    prefill_tps: float | None = None
    decode_tps: float | None = None
    request_blob: str | None = None
    response_blob: str | None = None
    retags: int = 0
    last_position: int = 0
    finish_reason: str | None = None


assert CallRow.__struct_fields__ == tuple(c.name for c in calls.columns), "CallRow's fields are the table's columns"


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def _derive(row: CallRow) -> CallRow:
    """The row's durations and rates, from its moments and tokens."""
    started, first = row.started_at, row.first_token_at
    row.elapsed_s = _seconds(row.ended_at, started)
    if row.origin == "gateway":  # an import brings its own
        row.ttft_s = _seconds(first, started)
    row.prefill_tps = prefill_tps(row.input_tokens, row.ttft_s)
    row.decode_tps = decode_tps(row.output_tokens, _seconds(row.last_token_at, first))
    return row


def _finish(row: CallRow, ev: SFinished | SFailed) -> None:
    t = ev.timings
    row.ended_at = ended_at(t.finished, t.last_token, t.upstream_headers, t.received)
    row.first_token_at = t.first_token
    row.last_token_at = t.last_token
    row.response_blob = ev.response_blob
    row.usage_source = ev.usage_source
    if (usage := ev.usage) is not None:
        prompt = plausible_tokens("prompt_tokens", usage.prompt_tokens)
        completion = plausible_tokens("completion_tokens", usage.completion_tokens)
        cached = plausible_tokens("cached_tokens", usage.cached_tokens)
        row.input_tokens, row.output_tokens, row.cached_tokens = prompt or 0, completion or 0, cached
        if prompt is None or completion is None or (cached is None and usage.cached_tokens is not None):
            row.usage_source = IMPLAUSIBLE
    metrics = ev.request_metrics if isinstance(ev, SFinished) else None
    counts = spec_decode_counts(metrics.speculative_decoding) if metrics is not None else None
    row.spec_draft_tokens, row.spec_accepted_tokens, row.spec_steps = counts or (None, None, None)
    if isinstance(ev, SFinished):
        row.finish_reason = _finish_reason(ev.finish_reasons, ev.finish_choices)
        row.http_status = ev.status
        row.status = finished_status(ev.status)
        row.failure_reason = None
    else:
        row.finish_reason = None
        row.http_status = ev.client_status
        row.status = FAILED_END_STATUS
        row.failure_reason = ev.reason


def _finish_reason(reasons: list[str], choices: list[int | None]) -> str | None:
    """Choice 0's reason where the event says which choice each came from, else (older events) the first."""
    if choices:
        return next((projection_text(r) for r, i in zip(reasons, choices, strict=False) if i == 0), None)
    return projection_text(reasons[0]) if reasons else None


def _tagged(row: CallRow, tags: dict[str, str]) -> None:
    row.tags = _tags_encoder.encode(tags).decode()
    row.ticker = tags.get("ticker")


def _apply(row: CallRow | None, ev: Any, version: int, position: int) -> CallRow | None:
    """Apply one slim call event to a call's row (None = no row yet); returns the new row, its durations and
    rates not yet derived (`_derive`, once per row and page: they depend only on the row's final state)."""
    if isinstance(ev, SStarted):
        row = CallRow(
            version=version,
            call_id=ev.call_id,
            started_at=ev.received_at,
            run=projection_text_or_none(ev.run),
            model=projection_text_or_none(ev.model),
            request_blob=ev.request_blob,
        )
        _tagged(row, projection_tags(ev.tags))
    elif isinstance(ev, SImported):
        tokens_in = plausible_tokens("input_tokens", ev.input_tokens)
        tokens_out = plausible_tokens("output_tokens", ev.output_tokens)
        row = CallRow(
            version=version,
            call_id=ev.call_id,
            started_at=ev.started_at,
            run=projection_text_or_none(ev.run),
            model=projection_text_or_none(ev.model),
            origin="import",
            source=projection_text(f"{ev.source}:{ev.line}"),
            status=ev.status,
            # judged again: events imported before the rule say `imported` whatever their counts
            usage_source=ev.usage_source if tokens_in is not None and tokens_out is not None else IMPLAUSIBLE,
            ended_at=ev.finished_at,
            ttft_s=ev.ttft_s,
            input_tokens=tokens_in or 0,
            output_tokens=tokens_out or 0,
            finish_reason=projection_text_or_none(ev.finish_reason),
        )
        _tagged(row, projection_tags(ev.tags))
        if ev.ttft_s is not None:
            row.first_token_at = ev.started_at + timedelta(seconds=ev.ttft_s)
    elif isinstance(ev, SFinished | SFailed):
        if row is None:
            row = CallRow(version=version, call_id=ev.call_id, started_at=ev.timings.received)
        _finish(row, ev)
    elif isinstance(ev, CallRetagged):
        if row is None:
            return None
        if ev.run is not None:
            row.run = projection_text(ev.run)
        tags = _tags_decoder.decode(row.tags)
        tags.update(projection_tags(ev.tags))
        for name in map(projection_text, ev.removed_tags):
            tags.pop(name, None)
        _tagged(row, tags)
        row.retags += 1
    else:  # pragma: no cover - filtered by the caller
        return row
    row.last_position = position
    return row


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a page's decoding or folding (no await inside, no cycle made).

    A page allocates 100,000s of containers that live until it is written: the collector's passes over them
    were ≈ 6 µs a call, a fifth of the fold path (100k calls, SQLite, `bench/rebuild.py`).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_calls(page: Sequence[tuple[int, str, str]]) -> tuple[list[tuple[int, Any]], list[str]]:
    """The page's call events as (position, slim event), and the call ids whose first event in the page
    continues an earlier row (its stored state must be loaded)."""
    events: list[tuple[int, Any]] = []
    continuing: list[str] = []
    seen: set[str] = set()
    with _collector_paused():
        for position, type_, payload in page:
            if type_ not in HANDLED:
                continue
            ev = DECODERS[type_].decode(payload)
            events.append((position, ev))
            if (call_id := ev.call_id) not in seen:
                seen.add(call_id)
                if type_ not in FRESH:
                    continuing.append(call_id)
    return events, continuing


def fold_calls(events: Sequence[tuple[int, Any]], stored: Mapping[str, CallRow], version: int) -> list[CallRow]:
    """Fold `decode_calls`' events in position order onto `stored` (the rows of the continuing calls that have
    one; changed in place); returns the rows the events change, in the order of each call's first event."""
    rows: dict[str, CallRow | None] = {}
    with _collector_paused():
        for position, ev in events:
            call_id = ev.call_id
            rows[call_id] = _apply(rows[call_id] if call_id in rows else stored.get(call_id), ev, version, position)
        return [_derive(row) for row in rows.values() if row is not None]
