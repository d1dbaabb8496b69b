"""The demo's printed reports: its runs as the ledger recorded them, MoE ÷ dense beside the seed, the whole ledger."""

from __future__ import annotations

import re
import textwrap
from zoneinfo import ZoneInfo

import msgspec
from rich.console import Console
from rich.text import Text

from usage_ledger.answers import EraRow, daily_report, eras_report, runs_report, tickers_report
from usage_ledger.demo.plan import DemoOptions, DemoRun
from usage_ledger.ledger import Database
from usage_ledger.narrow import Column, fit_table
from usage_ledger.projections import DailyRow, RunRow, TickerRow

__all__ = ("Reports", "Rows", "print_command", "print_reports", "read_reports", "show", "table")


class Reports(msgspec.Struct, frozen=True):
    aggregate: list[RunRow]
    per_call: list[RunRow]
    """This demo's runs, under each formula."""
    tickers: list[TickerRow]
    daily: list[DailyRow]
    daily_utc: list[DailyRow]
    eras: list[EraRow]
    eras_per_call: list[EraRow]
    """The whole ledger's (earlier demos' runs too)."""


async def read_reports(database: Database, runs: list[DemoRun], tz: str) -> Reports:
    async def of_runs(formula: str) -> list[RunRow]:
        return [row for run in runs for row in await runs_report(database, formula=formula, run=run.run)]

    return Reports(
        await of_runs("batch_aggregate"),
        await of_runs("per_call_mean"),
        [row for run in runs for row in await tickers_report(database, run=run.run)],
        await daily_report(database, tz=tz),
        await daily_report(database, tz="UTC"),
        await eras_report(database, by="model", formula="batch_aggregate", zone=ZoneInfo(tz)),
        await eras_report(database, by="model", formula="per_call_mean", zone=ZoneInfo(tz)),
    )


class Rows:
    """A table to print: its title, columns (`usage_ledger.narrow`) and rows of text cells, fitted when shown."""

    def __init__(self, title: str, columns: list[Column]) -> None:
        self.title = title
        self.columns = columns
        self.rows: list[list[str]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))


def table(
    title: str,
    columns: tuple[str, ...],
    *,
    left: int = 1,
    keep: tuple[str, ...] = (),
    priority: dict[str, float] | None = None,
) -> Rows:
    """A table in `report`'s style; the first `left` columns are text, the rest numbers. On a narrow console the
    lowest `priority` columns go first (default: the rightmost), never those in `keep` (the figures the table is
    for) nor the first (a name: shortened in the middle, after the columns of negative priority)."""
    ranks = priority or {}
    return Rows(
        title,
        [
            Column(name, numeric=i >= left, priority=ranks.get(name, -i), keep=name in keep)
            for i, name in enumerate(columns)
        ],
    )


def show(console: Console, out: Rows) -> None:
    """The title on a line of its own, as `report` prints it; the table fitted to the console, what it left out said."""
    console.print(Text(out.title, style="bold"))
    fitted = fit_table(out.columns, out.rows, console.width)
    console.print(fitted.table)
    if fitted.hidden:
        console.print(Text(f"left out at this width: {', '.join(fitted.hidden)}", style="dim"))


def print_reports(
    options: DemoOptions,
    speed: float,
    first: list[DemoRun],
    repeats: list[DemoRun],
    reports: Reports,
    console: Console,
) -> None:
    """The tables: `first` are the boxes' batches (the story's runs), `repeats` their repetitions."""
    recorded = table(
        "This demo's runs as the ledger recorded them (input, output: tokens; aggregate, per-call: output "
        "tokens per second; -seed2: the repetitions)",
        ("run", "calls", "tickers", "input", "output", "wall s", "aggregate", "per-call"),
        keep=("aggregate", "per-call"),
        priority={"tickers": -3, "input": -2, "calls": 1, "wall s": 2, "output": 3},
    )
    for aggregate, per_call in zip(reports.aggregate, reports.per_call, strict=True):
        recorded.add_row(
            aggregate.run,
            f"{aggregate.calls:,}",
            f"{aggregate.tickers:,}",
            _tokens(aggregate.input_tokens),
            _tokens(aggregate.output_tokens),
            _num(aggregate.wall_s, 1),
            _num(aggregate.throughput_tps, 0),
            _num(per_call.throughput_tps, 0),
        )
    show(console, recorded)
    failed = sum(row.failed_calls for row in reports.aggregate)
    if failed:
        console.print(f"[red]{failed} calls failed[/] (ledger show run RUN lists them)")
    show(console, _story(speed, first, reports))
    explained = (
        "aggregate = Σ output tokens ÷ (last call end − first call start): what the box delivered "
        "(batch_aggregate, the default formula). per-call = mean over calls of output tokens ÷ the "
        "call's own duration (per_call_mean): under continuous batching calls share the GPU, so it "
        "is one request's speed, not the box's throughput. Both: ledger report runs --formula NAME."
    )
    console.print(textwrap.fill(explained, console.width - 1, subsequent_indent="  "), markup=False)
    if any(run.effective_speed < 0.9 * speed for run in first):
        kept = " and ".join(f"{run.profile.name} {run.effective_speed:,.0f}×" for run in first)
        skew = first[0].effective_speed / first[-1].effective_speed
        console.print(
            f"[yellow]This machine could not keep the clocks at {speed:,.0f}× (they averaged {kept}):[/] the "
            f"ledger's rates are below the GPU's × {speed:,.0f}, and its ratios off by about {skew:.2f}×. A larger "
            "--seconds runs the clocks slower; fewer other jobs on the machine let them keep up."
        )
    top = table(
        "Top tickers by output tokens",
        ("run", "ticker", "calls", "input tok", "output tok"),
        left=2,
        keep=("ticker", "output tok"),
    )
    batches = {run.run for run in first}  # a repetition's answers are as long as its batch's: the same prompts
    for row in sorted((r for r in reports.tickers if r.run in batches), key=lambda r: -r.output_tokens)[:8]:
        top.add_row(row.run, row.ticker, str(row.calls), _tokens(row.input_tokens), _tokens(row.output_tokens))
    show(console, top)
    for title, rows in ((f"Daily totals ({options.tz})", reports.daily), ("Daily totals (UTC)", reports.daily_utc)):
        daily = table(
            f"{title}, the whole ledger", ("day", "calls", "failed", "input tok", "output tok"), keep=("output tok",)
        )
        for day in rows:
            daily.add_row(
                day.day,
                f"{day.calls:,}",
                f"{day.failed_calls:,}",
                _tokens(day.input_tokens),
                _tokens(day.output_tokens),
            )
        show(console, daily)
    eras = table(
        "Eras by model, every run in the ledger (ledger report eras --by model)",
        ("model", "runs", "days", "aggregate t/s", "per-call t/s", "mean wall"),
        keep=("aggregate t/s", "per-call t/s"),
    )
    per_call_eras = {row.group: row for row in reports.eras_per_call}
    for era in reports.eras:
        other = per_call_eras.get(era.group)
        eras.add_row(
            era.group or "—",
            str(era.runs),
            str(era.days),
            _num(era.mean_throughput_tps, 0),
            _num(other.mean_throughput_tps if other else None, 0),
            _duration(era.mean_wall_s) if era.mean_wall_s is not None else "—",
        )
    show(console, eras)


def print_command(console: Console, command: str) -> None:
    """A command to copy, indented, continued with `\\` before an option when it is wider than the console."""
    lines = [""]
    for part in re.split(r" (?=--)", command):
        if lines[-1] and len(lines[-1]) + 1 + len(part) > console.width - 8:
            lines.append(part)
        else:
            lines[-1] = f"{lines[-1]} {part}".lstrip()
    console.print(
        " \\\n      ".join(f"  {lines[0]}" if i == 0 else line for i, line in enumerate(lines)),
        soft_wrap=True,
        markup=False,
        highlight=False,
    )


def _story(speed: float, first: list[DemoRun], reports: Reports) -> Rows:
    """The README's point from the ledger's own figures: MoE ÷ dense under each formula, beside the seed's."""
    aggregate = {row.run: row for row in reports.aggregate}
    per_call = {row.run: row for row in reports.per_call}
    fast, slow = aggregate[first[0].run], aggregate[first[-1].run]
    fast_call, slow_call = per_call[first[0].run], per_call[first[-1].run]
    a, b = first[0].profile, first[-1].profile
    story = table(
        f"{a.name} ÷ {b.name}, from the ledger (both clocks at {speed:,.0f}× real time: ratios are the GPU's)",
        ("formula", a.name, b.name, f"{a.name} ÷ {b.name}", "seed, one 5090"),
        keep=(a.name, b.name, f"{a.name} ÷ {b.name}"),
    )
    seed_aggregate = f"{a.seed_tps:,.0f} ÷ {b.seed_tps:,.0f} = {a.seed_tps / b.seed_tps:.1f}×"
    per_a, per_b = a.seed_tps / a.concurrency, b.seed_tps / b.concurrency
    seed_per_call = f"{per_a:,.0f} ÷ {per_b:,.0f} ≈ {per_a / per_b:.1f}×"
    for name, x, y, seed in (
        ("aggregate t/s", fast.throughput_tps, slow.throughput_tps, seed_aggregate),
        ("per-call t/s", fast_call.throughput_tps, slow_call.throughput_tps, seed_per_call),
    ):
        story.add_row(name, _num(x, 0), _num(y, 0), _ratio(x, y), seed)
    x, y = fast.throughput_tps, slow.throughput_tps
    story.add_row(
        f"aggregate ÷ {speed:,.0f}",
        _num(x / speed if x is not None else None, 0),
        _num(y / speed if y is not None else None, 0),
        "",
        f"{a.seed_tps:,.0f} and {b.seed_tps:,.0f} t/s",
    )
    return story


def _ratio(x: float | None, y: float | None) -> str:
    return "—" if x is None or not y else f"{x / y:.1f}×"


def _tokens(count: int) -> str:
    return f"{count / 1e6:,.2f}M" if count >= 1_000_000 else f"{count:,}"


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"
