"""`ledger compare`'s table: metrics as rows, one column per run (A, B, …), then each run ÷ A.

Fits 100 columns for three runs; what does not fit a cell (differences, findings, config) is
listed under the table, wrapped to its width.
"""

from __future__ import annotations

import io
import string
import textwrap

from rich.console import Console
from rich.table import Table

from usage_ledger.answers.comparison import Comparison, metric_values
from usage_ledger.answers.eras import left_out_reason

__all__ = ("comparison_table",)

_SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "calls and tokens",
        (
            ("calls", "calls"),
            ("failed_calls", "failed calls"),
            ("truncated_calls", "truncated calls"),
            ("tickers", "tickers"),
            ("input_tokens", "input tokens"),
            ("output_tokens", "output tokens"),
            ("wall_s", "wall s"),
            ("hours_per_100_tickers", "h per 100 tickers"),
            ("calls_per_ticker.min", "calls/ticker min"),
            ("calls_per_ticker.median", "calls/ticker median"),
            ("calls_per_ticker.max", "calls/ticker max"),
            ("in_flight_mean", "in flight mean"),
            ("in_flight_max", "in flight max"),
        ),
    ),
    (
        "cost (annotated price per hour × wall time)",
        (
            ("cost.per_100_tickers", "per 100 tickers"),
            ("cost.per_million_output_tokens", "per M output tokens"),
        ),
    ),
    (
        "latency, ms (vllm bench serve)",
        tuple(
            (f"{name}.{part}", f"{label} {part}")
            for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "e2e"))
            for part in ("p50", "p90", "p99", "mean")
        ),
    ),
    (
        "server (sampled /metrics)",
        (
            ("server.spec_decode_acceptance_rate", "spec acceptance"),
            ("server.spec_decode_mean_acceptance_length", "spec accept length"),
            ("server.kv_cache_usage_max", "KV cache max"),
            ("server.requests_running_mean", "running mean"),
            ("server.requests_running_max", "running max"),
            ("server.requests_waiting_max", "waiting max"),
            ("server.preemptions", "preemptions"),
            ("server.prefix_cache_hit_rate", "prefix hit rate"),
        ),
    ),
)


# The server config labels shown under the table (JSON has them all; audit lists every difference).
_CONFIG_SHOWN = ("cache_dtype", "enable_prefix_caching", "block_size", "num_gpu_blocks")


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "no"


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:#.3g}"


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def _notes(comparison: Comparison, letters: str) -> list[str]:
    lines: list[str] = []
    for letter, run in zip(letters, comparison.runs, strict=False):
        lines.append(f"{letter} = {run.run}" + (f" ({run.model})" if run.model else ""))
    lines.append(f"promoted throughput formula: {comparison.runs[0].formula}")
    for letter, run in zip(letters, comparison.runs, strict=False):
        why = left_out_reason(run.ok_calls, run.throughput_tps.get(run.formula), run.formula)
        if why is not None:
            lines.append(f"{letter}: no throughput and no hours per 100 tickers: {why}")
        if run.cost is not None:
            lines.append(f"{letter}: cost in {run.cost.currency} at {run.cost.price_per_hour:g} an hour")
        if run.partial and run.tickers_done is not None:
            lines.append(
                f"{letter}: partial (fewer calls than the run it replays): hours per 100 tickers count "
                f"{run.tickers_done:.2f} tickers by their calls done, of {run.tickers} touched"
            )
        measured = f"{run.ok_calls} ok calls measured; ITL from {run.itl_calls} with chunk gaps"
        lines.append(f"{letter}: {measured}" + ("" if run.itl_calls else " (none recorded: imported or not streamed)"))
        if run.server is None:
            lines.append(f"{letter}: server not sampled")
        else:
            config = run.server.config or {}
            shown = ", ".join(f"{k}={config[k]}" for k in _CONFIG_SHOWN if k in config) or "not seen"
            lines.append(f"{letter}: server reconciled: {_yes_no(run.server.reconciled)}; config: {shown}")
        lines += [f"{letter}: {finding}" for finding in run.findings]
        lines += [f"{letter} differs from A: {difference}" for difference in run.differences]
    return lines


def comparison_table(comparison: Comparison, *, width: int = 100) -> str:
    letters = string.ascii_uppercase
    runs = comparison.runs
    values = [metric_values(run) for run in runs]
    table = Table(title="compare", title_justify="left")
    table.add_column("metric", no_wrap=True)
    for letter in letters[: len(runs)]:
        table.add_column(letter, justify="right")
    for letter, _ in zip(letters[1:], comparison.ratios, strict=False):
        table.add_column(f"{letter}÷A", justify="right")
    formulas = sorted(runs[0].throughput_tps)
    first = ("throughput", tuple((f"throughput_tps.{f}", f"tok/s {f}") for f in formulas))
    priced = any(run.cost is not None for run in runs)
    for title, rows in (_SECTIONS[0], first, *_SECTIONS[1:]):
        if title.startswith("cost") and not priced:
            continue  # without a price nothing is shown
        table.add_row(f"[bold]{title}[/bold]", *([""] * (len(runs) + len(comparison.ratios))))
        for key, label in rows:
            cells = [_cell(v[key]) for v in values]
            ratios = [_ratio_cell(r.values.get(key)) for r in comparison.ratios]
            table.add_row(label, *cells, *ratios)
    width = max(width, 24 + 16 * len(runs) + 9 * len(comparison.ratios))
    out = io.StringIO()
    console = Console(file=out, width=width, no_color=True, highlight=False)
    console.print(table)
    for line in _notes(comparison, letters):  # wrapped to the table's width, continuations indented
        console.print(textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False), markup=False)
    return out.getvalue()
