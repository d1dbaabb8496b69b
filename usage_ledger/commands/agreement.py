"""`ledger agreement`: the command's work and its table (docs/decide.md, "Agreement")."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from usage_ledger.commands.support import (
    add_db_option,
    add_format_option,
    add_run_gap_option,
    async_command,
    checked_database,
    logged_settings,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from usage_ledger.answers import Agreement
    from usage_ledger.ledger import Database

__all__ = ("add_agreement_parser", "agreement_command")


def add_agreement_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "agreement",
        help="how far repeated runs agree on a label per key (QWK, raw agreement), and each run's rank IC",
    )
    add_db_option(p)
    p.add_argument("runs", nargs="+", metavar="RUN", help="two or more runs")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--extract", metavar="REGEX", help="the label: this regex's one group in the assistant text")
    source.add_argument(
        "--extract-json", metavar="POINTER", help="the label: this RFC 6901 pointer into the JSON content"
    )
    source.add_argument("--labels", dest="labels_file", metavar="FILE", help="labels from a CSV: run,key,label")
    p.add_argument("--key", default="ticker", metavar="TAG", help="the tag that names a key (default %(default)s)")
    p.add_argument("--scale", metavar="A,B,C", help="the ordered labels, lowest first (default: sorted labels)")
    p.add_argument(
        "--where", action="append", default=[], metavar="TAG=VALUE", help="only calls with this tag value; repeatable"
    )
    p.add_argument("--outcomes", dest="outcomes_file", metavar="FILE", help="CSV of key and outcome: adds rank IC")
    p.add_argument("--outcome-column", metavar="COL", help="the outcome's column in --outcomes")
    add_run_gap_option(p)
    add_format_option(p, "table", "json")
    p.set_defaults(func=agreement_command)


@async_command
async def agreement_command(args: argparse.Namespace) -> int:
    """Exit 0 with the report, 2 for bad usage or input (an unknown run, a label outside --scale)."""

    from usage_ledger.answers import agreement_report

    settings = logged_settings(args, "run_gap_s")
    # labels from a file need no ledger
    ledger: contextlib.AbstractAsyncContextManager[Database | None] = (
        contextlib.nullcontext() if args.labels_file else checked_database(settings)
    )
    async with ledger as database:
        result = await agreement_report(
            database,
            args.runs,
            extract=args.extract,
            extract_json=args.extract_json,
            labels_file=Path(args.labels_file) if args.labels_file else None,
            key=args.key,
            where=args.where,
            scale=args.scale,
            outcomes_file=Path(args.outcomes_file) if args.outcomes_file else None,
            outcome_column=args.outcome_column,
            run_gap_s=settings.reports.run_gap_s,
        )
    if args.output_format == "json":
        sys.stdout.buffer.write(msgspec.json.encode(result.report) + b"\n")
        for note in result.notes:
            print(f"ledger: note: {note}", file=sys.stderr)
    else:
        print_agreement(result, key=args.key if not args.labels_file else "key")
    return 0


def _table(console: Console, title: str, *columns: str) -> Table:
    from rich import box
    from rich.table import Table

    console.print(f"\n[bold]{title}[/bold]")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
    return table


def _pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.1f} %)" if whole else f"{part}/{whole}"


def _share(part: int, whole: int) -> str:
    return f"{part} ({100 * part / whole:.0f} %)" if whole else "-"


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def print_agreement(result: Agreement, *, key: str) -> None:
    """The report as tables: pairs, distribution, labels per run, rank IC, then the notes."""
    from rich.console import Console

    from usage_ledger.commands.output import terminal_width

    console = Console(width=terminal_width(), soft_wrap=False, highlight=False)
    report = result.report
    console.print(f"[bold]Agreement[/bold] of {len(result.runs)} runs, one label per {key}")
    console.print("scale (lowest first): " + " < ".join(result.scale) if result.scale else "scale: no labels")
    pairs = _table(console, "pairs", "run a", "run b", "keys", "QWK", "raw agreement")
    for pair in report.pairs:
        pairs.add_row(pair.a, pair.b, str(pair.n), _value(pair.qwk), _pct(pair.raw_agree, pair.raw_total))
    console.print(pairs)
    counted = sum(p.qwk is not None for p in report.pairs)
    console.print(f"mean QWK {_value(report.mean_qwk)} over {counted} of {len(report.pairs)} pairs")
    spread = _table(console, "distribution (keys per label)", "label", *(run.run for run in result.runs))
    for label in result.scale:
        cells = [_share(report.distribution[run.run][label], len(run.labels)) for run in result.runs]
        spread.add_row(label, *cells)
    console.print(spread)
    coverage = _table(console, "labels per run", "run", "keys", "labelled", "without a label")
    for run in result.runs:
        missing = ", ".join(f"{why} {n}" for why, n in sorted(run.unlabelled.items())) or "-"
        coverage.add_row(run.run, str(run.keys), str(len(run.labels)), missing)
    console.print(coverage)
    if report.rank_ic:
        ic = _table(
            console, "rank IC (Spearman: the label's place on the scale vs the outcome)", "run", "keys", "rank IC"
        )
        for run in result.runs:
            ic.add_row(run.run, str(result.rank_ic_n[run.run]), _value(report.rank_ic[run.run]))
        console.print(ic)
    if result.notes:
        console.print()
    for note in result.notes:
        console.print(f"note: {note}")
    without_key = [f"{run.run} {run.calls_without_key}" for run in result.runs if run.calls_without_key]
    if without_key:
        console.print(f"note: calls without a {key} tag, left out: {', '.join(without_key)}")
