"""`ledger labels import`, `ledger returns import` and `ledger decide` (docs/decide.md, "The decision")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from usage_ledger.answers import Decision, Evidence, GroupFigures, ICSeries
    from usage_ledger.imports import Recorded
    from usage_ledger.projections import CostMeans

from usage_ledger.commands.support import (
    add_db_option,
    add_format_option,
    add_run_gap_option,
    async_command,
    checked_database,
    logged_settings,
)

__all__ = ("add_decide_parsers",)


def add_decide_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    labels = sub.add_parser("labels", help="labels of runs' keys as ledger events (what `ledger decide` reads)")
    labels_sub = labels.add_subparsers(dest="labels_command", metavar="ACTION", required=True)
    p = labels_sub.add_parser("import", help="from a CSV (run,key,label) or the run's stored answers (--run --extract)")
    add_db_option(p)
    p.add_argument("file", nargs="?", metavar="FILE.csv", help="columns run,key,label")
    p.add_argument("--run", help="read the labels from this run's stored answers (with --extract)")
    p.add_argument("--extract", metavar="REGEX", help="the label: this regex's one group in the assistant text")
    p.add_argument(
        "--key", default="ticker", metavar="TAG", help="with --extract: the tag naming a key (default %(default)s)"
    )
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="TAG=VALUE",
        help="with --extract: only calls with this tag value",
    )
    add_run_gap_option(p)
    p.set_defaults(func=labels_import_command)

    returns = sub.add_parser("returns", help="realized returns per key as ledger events (rank IC in `ledger decide`)")
    returns_sub = returns.add_subparsers(dest="returns_command", metavar="ACTION", required=True)
    p = returns_sub.add_parser("import", help="from a CSV: key,return[,as_of]")
    add_db_option(p)
    p.add_argument("file", metavar="FILE.csv")
    p.set_defaults(func=returns_import_command)

    p = sub.add_parser("decide", help="the adoption decision: two groups of runs side by side, and what is unmeasured")
    add_db_option(p)
    p.add_argument("--a", nargs="+", required=True, metavar="RUN", help="group a's runs (e.g. the current model's)")
    p.add_argument("--b", nargs="+", required=True, metavar="RUN", help="group b's runs (the candidate's)")
    p.add_argument("--scale", required=True, metavar="L1,L2,…", help="the ordered labels, lowest first")
    p.add_argument("--as-of", dest="as_of", metavar="YYYY-MM-DD", help="returns as of this date (default: the latest)")
    add_run_gap_option(p)
    add_format_option(p, "table", "json")
    p.set_defaults(func=decide_command)


def _print_recorded(what: str, result: Recorded) -> None:
    if result.appended:
        print(f"{what} appended at position {result.position}: {result.rows} from {result.source}")
    else:
        print(
            f"{what} from {result.source}: already in the ledger, as its current values (latest event "
            f"{result.event_id}); nothing appended"
        )
    for warning in result.warnings:
        print(f"ledger: warning: {warning}", file=sys.stderr)


@async_command
async def labels_import_command(args: argparse.Namespace) -> int:
    """Exit 0 when recorded (or already there), 2 for a bad row, an unknown run or bad usage (nothing appended)."""

    from usage_ledger.imports import extract_labels, import_labels
    from usage_ledger.projections import ProjectionError

    if (args.file is None) == (args.run is None) or (args.run is None) != (args.extract is None):
        raise ProjectionError("give FILE.csv, or --run RUN with --extract REGEX")
    settings = logged_settings(args, "run_gap_s")
    gap = settings.reports.run_gap_s
    async with checked_database(settings) as database:
        if args.file is not None:
            result = await import_labels(database, args.file, run_gap_s=gap)
        else:
            result = await extract_labels(
                database, args.run, args.extract, key=args.key, where=args.where, run_gap_s=gap
            )
    _print_recorded("labels.recorded", result)
    return 0


@async_command
async def returns_import_command(args: argparse.Namespace) -> int:
    """Exit 0 when recorded (or already there), 2 for a bad row (nothing appended)."""

    from usage_ledger.imports import import_returns

    settings = logged_settings(args)
    async with checked_database(settings) as database:
        result = await import_returns(database, Path(args.file))
    _print_recorded("returns.recorded", result)
    return 0


@async_command
async def decide_command(args: argparse.Namespace) -> int:
    """Exit 0 with the report; 2 for an unknown run, a label outside --scale or other bad usage."""

    from usage_ledger.answers import decide
    from usage_ledger.projections import ProjectionError, parse_as_of

    try:
        as_of = parse_as_of(args.as_of or "", "--as-of")
    except ValueError as exc:
        raise ProjectionError(str(exc)) from exc
    settings = logged_settings(args, "run_gap_s")
    async with checked_database(settings) as database:
        result = await decide(database, args.a, args.b, args.scale, as_of=as_of, run_gap_s=settings.reports.run_gap_s)
    if args.output_format == "json":
        sys.stdout.buffer.write(msgspec.json.encode(result) + b"\n")
    else:
        print_decision(result)
    return 0


def _cell(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _cost(cost: CostMeans | None, name: str) -> str:
    value = getattr(cost, name) if cost is not None else None
    return "-" if cost is None or value is None else f"{value:,.2f} {cost.currency}"


def _measured(group: GroupFigures) -> str:
    """How many runs the throughput and hours rest on, and which were left out and why."""
    left = "; ".join(f"not {run}: {why}" for run, why in group.left_out.items())
    return f"{group.measured_runs} of {len(group.runs)}" + (f" ({left})" if left else "")


def _with_ci(value: float | None, evidence: Evidence | None, digits: int) -> str:
    """The figure and, when there is one, its 95 % interval: `0.1234 [0.06, 0.39]` (interval to 2 fewer digits)."""
    text = _cell(value, digits)
    if evidence is None or evidence.ci95 is None:
        return text
    short = max(1, digits - 2)
    return f"{text} [{evidence.ci95[0]:,.{short}f}, {evidence.ci95[1]:,.{short}f}]"


def _figure(name: str, a: GroupFigures, b: GroupFigures, digits: int) -> tuple[str, str, str]:
    first, second = getattr(a, name), getattr(b, name)
    return (name, _with_ci(first, a.evidence.get(name), digits), _with_ci(second, b.evidence.get(name), digits))


def _rows(a: GroupFigures, b: GroupFigures) -> list[tuple[str, str, str]]:
    from usage_ledger.answers import LATENCY_FIGURES

    rows = [
        ("runs", ", ".join(a.runs), ", ".join(b.runs)),
        ("measured_runs", _measured(a), _measured(b)),
        _figure("throughput_tps", a, b, 1),
        ("hours_per_100_tickers", _cell(a.hours_per_100_tickers, 2), _cell(b.hours_per_100_tickers, 2)),
    ]
    if a.cost is not None or b.cost is not None:  # without a price nothing is shown
        for name in ("per_100_tickers", "per_million_output_tokens"):
            rows.append((f"cost.{name}", _cost(a.cost, name), _cost(b.cost, name)))
    rows += [(name, _cell(a.latency.get(name), 1), _cell(b.latency.get(name), 1)) for name in LATENCY_FIGURES]
    for name in sorted(a.server.keys() | b.server.keys()):
        rows.append((f"server.{name}", _cell(a.server.get(name)), _cell(b.server.get(name))))
    rows += [_figure("self_qwk", a, b, 4), _figure("self_agree_rate", a, b, 4)]
    for label in a.label_shares or b.label_shares:  # both in scale order, or empty without labels
        rows.append((f"label_shares.{label}", _cell(a.label_shares.get(label)), _cell(b.label_shares.get(label))))
    rows.append(_figure("rank_ic", a, b, 4))
    return rows


def _samples(result: Decision) -> list[str]:
    """What each interval rests on (n per group), and why a figure has none."""
    lines = []
    for name, unit in (("throughput_tps", " runs"), ("self_qwk", ""), ("rank_ic", " tickers")):
        lines.append(f"{name} {_n(result.a.evidence.get(name))} | {_n(result.b.evidence.get(name))}{unit}")
    out = ["n (a | b): " + "; ".join(lines)]  # self_agree_rate rests on self_qwk's tickers
    for group, figures in (("a", result.a), ("b", result.b)):
        for name, evidence in figures.evidence.items():
            if evidence.ci95 is None and evidence.reason:
                out.append(f"no interval for {group}.{name}: {evidence.reason}")
    return out


def _n(evidence: Evidence | None) -> str:
    return "-" if evidence is None else str(evidence.n)


def _series(group: str, series: ICSeries) -> str:
    share = "-" if series.share_positive is None else f"{100 * series.share_positive:.0f} %"
    dates = ", ".join(f"{p.as_of} {_cell(p.ic)}" for p in series.dates)
    return (
        f"rank IC by date, {group}: {len(series.dates)} dates, mean {_cell(series.mean)}, sd {_cell(series.sd)}, "
        f"t {_cell(series.t, 2)}, above zero {share} ({dates})"
    )


def print_decision(result: Decision) -> None:
    """Groups as columns, then between-group agreement, flipped keys and what is unmeasured."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from usage_ledger.commands.output import terminal_width

    console = Console(width=terminal_width(), soft_wrap=False, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, name in enumerate(("figure", "a", "b")):  # long run names fold, the figures' names never
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold", no_wrap=i == 0)
    for row in _rows(result.a, result.b):
        table.add_row(*row)
    console.print("[bold]Decision[/bold]: the evidence side by side (no verdict)")
    console.print("figure [low, high]: 95 % interval (bootstrap over tickers; runs for throughput)", markup=False)
    console.print(table)
    for line in _samples(result):
        console.print(line)
    if result.within_noise:
        console.print(f"within noise (the a and b intervals overlap): {', '.join(result.within_noise)}")
    for group, figures in (("a", result.a), ("b", result.b)):
        if figures.rank_ic_series is not None:
            console.print(_series(group, figures.rank_ic_series))
    between = result.between
    qwk = _with_ci(between.qwk, between.evidence.get("qwk"), 4)
    rate = _with_ci(between.agree_rate, between.evidence.get("agree_rate"), 4)
    console.print(f"between a and b (n {_n(between.evidence.get('qwk'))}): QWK {qwk}, agree rate {rate}")
    if between.flipped:
        flips = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title="flipped keys (most frequent label)")
        for name in ("key", "a", "b"):
            flips.add_column(name)
        for flip in between.flipped:
            flips.add_row(
                flip.key,
                " = ".join(flip.a) + (" (tie)" if len(flip.a) > 1 else ""),
                " = ".join(flip.b) + (" (tie)" if len(flip.b) > 1 else ""),
            )
        console.print(flips)
    else:
        console.print("no flipped keys")
    for item in result.unmeasured:
        console.print(f"unmeasured: {item}")
