"""The notes under a `ledger report runs|eras` table: what its tok/s is, runs partial, failed or unlabelled, costs."""

from __future__ import annotations

import argparse
import textwrap

import msgspec

from usage_ledger.answers import EraRow
from usage_ledger.commands.output import terminal_width
from usage_ledger.projections import FORMULAS, RunRow, get_formula

__all__ = ("print_table_notes",)


def print_table_notes(args: argparse.Namespace, rows: list[msgspec.Struct], more: list[str]) -> None:
    """Under a runs or eras table: what its tok/s is, and how to label the runs an eras table could not group."""
    first = rows[0]
    if not isinstance(first, RunRow | EraRow):
        return
    definition = (get_formula(first.formula).__doc__ or "").strip().splitlines()[0]
    others = " or ".join(sorted(set(FORMULAS) - {first.formula}))
    notes = [f"tok/s = {first.formula}: {definition} (--formula {others} for another)"]
    unlabelled = sum(row.runs for row in rows if isinstance(row, EraRow) and row.group is None)
    if unlabelled:
        flag = f"--{args.by} VALUE" if args.by in ("hardware", "model", "kind") else f"--label {args.by}=VALUE"
        notes.append(
            f"-: {unlabelled} run{'s' if unlabelled > 1 else ''} without a {args.by} label; "
            f"label a run with `ledger annotate --run R {flag}`"
        )
    for row in rows:
        if isinstance(row, RunRow) and row.partial and row.tickers_done is not None:
            notes.append(
                f"{row.run}: partial, fewer calls than the run it replays; h/100 tickers count "
                f"{row.tickers_done:.2f} tickers by their calls done"
            )
        if isinstance(row, RunRow) and not row.calls - row.failed_calls - row.incomplete_calls:
            notes.append(f"{row.run}: no completed call: no tok/s, in no mean")
        if isinstance(row, EraRow) and row.cost is not None:
            cost, per_m = row.cost, row.cost.per_million_output_tokens
            per_100 = "-" if cost.per_100_tickers is None else f"{cost.per_100_tickers:,.2f}"
            notes.append(
                f"{row.group or '-'}: {per_100} {cost.currency} per 100 tickers, "
                f"{'-' if per_m is None else f'{per_m:,.2f}'} {cost.currency} per M output tokens "
                f"(mean of {cost.priced_runs} priced runs)"
            )
        if isinstance(row, EraRow) and row.left_out:
            why = "; ".join(f"{n} with {reason}" for reason, n in sorted(row.left_out.items()))
            notes.append(
                f"{row.group or '-'}: {row.runs - row.measured_runs} of {row.runs} runs not in its means ({why})"
            )
    for note in notes + more:
        print(textwrap.fill(note, terminal_width(), subsequent_indent="    "))
