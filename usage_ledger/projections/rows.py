"""Report rows: frozen msgspec Structs whose field names are the DESIGN §6 contract."""

from __future__ import annotations

from datetime import datetime

import msgspec

from usage_ledger.projections.cost import RunCost
from usage_ledger.projections.server import ServerBlock

__all__ = (
    "CallView",
    "CallsPage",
    "CallsPerTicker",
    "DailyRow",
    "RecomputeRow",
    "RunRow",
    "TickerRow",
    "WeekdayRow",
)


class CallsPerTicker(msgspec.Struct, frozen=True, kw_only=True):
    min: int
    median: float
    max: int


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    model: str | None
    calls: int
    failed_calls: int
    incomplete_calls: int
    truncated_calls: int | None = None
    """Calls whose answer was cut at its token limit (`call_rules.TRUNCATED_REASONS`); None where no call
    of the run says how it finished (imports without the field, events before finish reasons were kept)."""
    tickers: int
    input_tokens: int
    output_tokens: int
    started_at: datetime | None
    ended_at: datetime | None
    wall_s: float | None
    throughput_tps: float | None
    formula: str
    calls_per_ticker: CallsPerTicker | None
    hours_per_100_tickers: float | None
    """Wall time per 100 tickers done (`tickers_done`); None for a run with no completed call."""
    labels: dict[str, str] = {}
    server: ServerBlock | None = None
    """What the server did during the run (projections.server); None where nothing was sampled."""
    tickers_done: float | None = None
    """Tickers counted by their calls done: each its calls ÷ the calls it had in the run this one replays
    (`replay_of`), at most 1; each ticker 1 in a run that replays none. None: the run has no ticker."""
    partial: bool = False
    """The run did fewer calls than the run it replays (`ledger replay --limit`, or stopped early)."""
    cost: RunCost | None = None
    """What the run cost at the price per hour annotated on it (`projections.cost`); None without one."""


class TickerRow(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    ticker: str
    calls: int
    input_tokens: int
    output_tokens: int


class DailyRow(msgspec.Struct, frozen=True, kw_only=True):
    day: str
    calls: int
    failed_calls: int
    input_tokens: int
    output_tokens: int


class WeekdayRow(msgspec.Struct, frozen=True, kw_only=True):
    """Mean per calendar day over the days (with calls) that fall on `weekday` (`Mon-Fri` = all weekdays)."""

    weekday: str
    days: int
    calls: float
    failed_calls: float
    input_tokens: float
    output_tokens: float


class RecomputeRow(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    old_formula: str
    old_tps: float | None
    new_formula: str
    new_tps: float | None
    change_pct: float | None


class CallView(msgspec.Struct, frozen=True, kw_only=True):
    """One call as the projections see it. `run` is None for untagged calls (reports group them by gaps)."""

    call_id: str
    run: str | None
    ticker: str | None
    tags: dict[str, str]
    model: str | None
    origin: str
    source: str | None
    status: str
    http_status: int | None
    failure_reason: str | None
    finish_reason: str | None = None
    """Choice 0's finish reason (`stop`, `length`, …; the Responses API's `incomplete_details.reason`)."""
    usage_source: str
    started_at: datetime
    first_token_at: datetime | None
    last_token_at: datetime | None
    ended_at: datetime | None
    elapsed_s: float | None
    ttft_s: float | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int | None
    prefill_tps: float | None
    decode_tps: float | None
    in_flight: int
    retags: int
    request_blob: str | None = None
    response_blob: str | None = None
    decode_tps_note: str | None = None
    """Why `decode_tps` is null, when it is."""
    last_position: int
    """Position of the last event folded into this row: it grows whenever the row changes (a retag, a finish),
    so `ledger export --since-position` selects the rows changed since an earlier export."""


class CallsPage(msgspec.Struct, frozen=True, kw_only=True):
    items: list[CallView]
    offset: int
    limit: int
    next_offset: int | None
    total: int | None = None
    """Calls matching the query on all pages (None only in pages written before it was counted)."""
