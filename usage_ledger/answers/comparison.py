"""What `ledger compare` answers: one column per run and each run's ratios against the first, and a
column's figures by name (`metric_values`).

Its own module so that `compare` (which fills it) and `_compare_table` (which draws it) both import
it, and neither imports the other.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from usage_ledger.answers.compare_latency import Latency
from usage_ledger.projections import CallsPerTicker, RunCost, ServerBlock

__all__ = ("COST_FIGURES", "Comparison", "Ratio", "RunComparison", "metric_values")


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


COST_FIGURES = ("per_100_tickers", "per_million_output_tokens")
_SERVER_FIGURES = (
    "spec_decode_acceptance_rate",
    "spec_decode_mean_acceptance_length",
    "kv_cache_usage_max",
    "requests_running_mean",
    "requests_running_max",
    "requests_waiting_max",
    "preemptions",
    "prefix_cache_hit_rate",
)


def metric_values(run: RunComparison) -> dict[str, float | None]:
    """The run's numeric figures by dotted name (`ttft_ms.p50`, `throughput_tps.batch_aggregate`, …)."""
    out: dict[str, float | None] = {
        "calls": run.calls,
        "failed_calls": run.failed_calls,
        "truncated_calls": run.truncated_calls,
        "tickers": run.tickers,
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "wall_s": run.wall_s,
    }
    out.update({f"throughput_tps.{name}": value for name, value in run.throughput_tps.items()})
    out["hours_per_100_tickers"] = run.hours_per_100_tickers
    per_ticker = run.calls_per_ticker
    for part in ("min", "median", "max"):
        out[f"calls_per_ticker.{part}"] = getattr(per_ticker, part) if per_ticker is not None else None
    out["in_flight_mean"] = run.in_flight_mean
    out["in_flight_max"] = run.in_flight_max
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        latency: Latency | None = getattr(run, name)
        for part in ("p50", "p90", "p99", "mean"):
            out[f"{name}.{part}"] = getattr(latency, part) if latency is not None else None
    for name in COST_FIGURES:
        out[f"cost.{name}"] = getattr(run.cost, name) if run.cost is not None else None
    server = run.server
    for name in _SERVER_FIGURES:
        value = getattr(server, name) if server is not None else None
        out[f"server.{name}"] = None if isinstance(value, bool) else value
    return out
