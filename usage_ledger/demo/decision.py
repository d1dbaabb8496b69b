"""The demo's last step: the runs' grades and synthetic returns recorded in the ledger, then `ledger decide`.

The grades come from the emulator's grade line (`--grade-line`: seeded, Hold-heavy, see
`emulator.grades`), read from the stored answers by the product's own `labels import --extract`
(`extract_labels`); the returns are seeded random draws per ticker, unrelated to the grades, written
to `synthetic-returns.csv` and recorded by `returns import` (`import_returns`), so the ledger's event
names their source. Both are synthetic and the demo says so.
"""

from __future__ import annotations

import csv
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

from rich.console import Console

from usage_ledger.answers import Decision, decide
from usage_ledger.demo.plan import DemoRun
from usage_ledger.demo.tables import print_command
from usage_ledger.emulator import GRADE_SCALE
from usage_ledger.imports import Recorded, extract_labels, import_returns
from usage_ledger.ledger import Database

__all__ = ("GRADE_PATTERN", "RETURNS_FILE", "SCALE", "print_decision_step", "record_evidence", "synthetic_returns")

GRADE_PATTERN = r"Grade: (.+)"
"""The emulator's grade line; the group is stripped of the spaces that pad it."""
SCALE = ",".join(GRADE_SCALE)
RETURNS_FILE = "synthetic-returns.csv"
"""The returns' file name, which the `returns.recorded` event keeps as its source."""


def synthetic_returns(tickers: list[str]) -> list[tuple[str, float]]:
    """A made-up forward return per ticker, the same in every demo: a draw from N(0, 8 %) seeded by the ticker."""
    return [(ticker, round(random.Random(f"synthetic return {ticker}").gauss(0.0, 0.08), 4)) for ticker in tickers]


async def record_evidence(
    database: Database, runs: list[DemoRun], steps: int, tickers: list[str], console: Console
) -> None:
    """Each run's grades (the last step's answer per ticker) and the tickers' synthetic returns, as events."""
    for run in runs:
        _said("labels", await extract_labels(database, run.run, GRADE_PATTERN, where=[f"step={steps}"]), console)
    with tempfile.TemporaryDirectory(prefix="ledger-demo-returns-") as tmp:
        path = Path(tmp) / RETURNS_FILE
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("key", "return"))
            writer.writerows((ticker, f"{value:.4f}") for ticker, value in synthetic_returns(tickers))
        _said("returns", await import_returns(database, path), console)


def _said(what: str, result: Recorded, console: Console) -> None:
    done = "recorded" if result.appended else "already in the ledger (an earlier demo), nothing appended"
    console.print(f"{what} of {result.source}: {result.rows} {done}", highlight=False)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)


async def print_decision_step(
    database: Database,
    first: list[DemoRun],
    repeats: list[DemoRun],
    url: str,
    console: Console,
    *,
    print_decision: Callable[[Decision], None],
    ui_port: int,
) -> Decision:
    """`ledger decide` over the two boxes (each its batch and its repetition), how to get it again, and what is
    synthetic in it. `print_decision` prints it as `ledger decide` does, `ui_port` is `ledger ui`'s default
    port: both the CLI's, passed in by it (the demo imports nothing of the CLI)."""
    group_a = [run.run for run in (first[0], repeats[0])]
    group_b = [run.run for run in (first[-1], repeats[-1])]
    result = await decide(database, group_a, group_b, SCALE)
    common = " and ".join(f"{run.tickers} on {run.profile.name}" for run in repeats)
    console.print(
        f"\n[bold]The decision[/]: {first[0].profile.name} (a) against {first[-1].profile.name} (b), each box's batch "
        f"and its repetition with another seed (ledger decide). Self-agreement is over the tickers both runs "
        f"graded ({common}; on few tickers, noisy figures)."
    )
    console.file.flush()
    print_decision(result)
    console.print("The same report, and on the dashboard (Decide page; `ledger ui` first):")
    runs = f"--a {' '.join(group_a)} --b {' '.join(group_b)}"
    print_command(console, f"ledger decide {runs} --scale '{SCALE}' --db {url}")
    query = urlencode({"a": ",".join(group_a), "b": ",".join(group_b), "scale": SCALE}, safe=",")
    console.print(f"  http://127.0.0.1:{ui_port}/_ledger/ui/decide?{query}", soft_wrap=True, highlight=False)
    console.print(
        "[bold]The grades and returns are synthetic.[/] The emulator's grade line is a seeded draw (Hold-heavy, "
        "like the user's grades), not an analysis of the ticker; the returns are random numbers per ticker, "
        "unrelated to the grades, so any rank IC here is chance. Only the throughput figures come from the "
        "(emulated) boxes; with your own runs, `ledger labels import` and `ledger returns import` record the "
        "real ones."
    )
    return result
