"""What `ledger compare` answers: one column per run and each run's ratios against the first.

Its own module so that `compare` (which fills it) and `_compare_table` (which draws it) both import
it, and neither imports the other.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from usage_ledger.answers.compare_latency import Latency
from usage_ledger.projections import CallsPerTicker, RunCost, ServerBlock

__all__ = ("Comparison", "Ratio", "RunComparison")


class RunComparison(msgspec.Struct, frozen=True, kw_only=True):
    """One run's column. Latencies in milliseconds (None: no call to measure)."""

    run: str
    model: str | None
    calls: int
    failed_calls: int
    truncated_calls: int | None = None
    """As `RunRow.truncated_calls`."""
    tickers: int
    input_tokens: int
    output_tokens: int
    started_at: datetime | None
    ended_at: datetime | None
    wall_s: float | None
    throughput_tps: dict[str, float | None]
    """Per registered formula (`projections.formulas`)."""
    formula: str
    """The promoted (default) formula."""
    hours_per_100_tickers: float | None
    calls_per_ticker: CallsPerTicker | None
    tickers_done: float | None = None
    """As `RunRow.tickers_done`: what `hours_per_100_tickers` divides by."""
    partial: bool = False
    """As `RunRow.partial`: fewer calls than the run it replays."""
    in_flight_mean: float | None
    in_flight_max: int | None
    ttft_ms: Latency | None
    tpot_ms: Latency | None
    itl_ms: Latency | None
    e2e_ms: Latency | None
    itl_calls: int
    """The ok calls whose chunk gaps are recorded and stored (the rest have none: imported, not streamed,
    older, or their gap blob is missing or redacted)."""
    ok_calls: int
    labels: dict[str, str] = {}
    server: ServerBlock | None = None
    cost: RunCost | None = None
    """As `RunRow.cost`."""
    findings: list[str] = []
    """What `ledger audit` finds inside this run (sampling or model varying, the server restarting)."""
    differences: list[str] = []
    """What `ledger audit RUN --against FIRST` finds different from the first run."""


class Ratio(msgspec.Struct, frozen=True, kw_only=True):
    """`run`'s figures divided by `against`'s (the first run's); None where either is missing or zero."""

    run: str
    against: str
    values: dict[str, float | None]


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    runs: list[RunComparison]
    ratios: list[Ratio]
