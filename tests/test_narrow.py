"""Tables at 80 and 100 columns (issue #54): narrow tables leave out the least important columns first (a zero-only
column before any figure), shorten run names in the middle, and never leave out the figure the table is for."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console

from tests.ledger.helpers import build_ledger
from tests.projections.fit_seed import LONG_RUN, seed_fit_ledger
from tests.projections.helpers import append, finished, started
from usage_ledger.cli import main
from usage_ledger.demo.plan import PLAN, DemoOptions, DemoRun
from usage_ledger.demo.tables import Reports, print_reports, read_reports
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import NewEvent
from usage_ledger.narrow import Column, clip_middle, fit_table
from usage_ledger.projections.engine import catch_up_all
from usage_ledger.workload import WorkloadResult

WIDTHS = (80, 100)


def _render(columns: list[Column], rows: list[list[str]], width: int) -> tuple[list[str], tuple[int, ...]]:
    fitted = fit_table(columns, rows, width)
    out = io.StringIO()
    Console(file=out, width=max(width, fitted.width), soft_wrap=False).print(fitted.table)
    return out.getvalue().splitlines(), fitted.shown


_cell = st.text(alphabet="abcdefghij-:0123456789", min_size=0, max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(st.tuples(st.booleans(), st.integers(-5, 5), st.booleans()), min_size=1, max_size=10),
    cells=st.lists(st.lists(_cell, min_size=10, max_size=10), min_size=1, max_size=6),
    width=st.integers(40, 140),
)
def test_a_fitted_table_fits_keeps_what_it_must_and_drops_empty_columns_first(
    kinds: list[tuple[bool, int, bool]], cells: list[list[str]], width: int
) -> None:
    columns = [Column(f"c{i}", numeric=i > 0 and n, priority=p, keep=k) for i, (n, p, k) in enumerate(kinds)]
    rows = [row[: len(columns)] for row in cells]
    lines, shown = _render(columns, rows, width)
    must = [0, *(i for i, c in enumerate(columns) if c.keep and i)]
    assert set(must) <= set(shown)  # the name and the kept figures, whatever the width
    needed = sum(max(cell_len(c.header), *(cell_len(r[i]) for r in rows)) for i, c in enumerate(columns) if i in must)
    if needed + 3 * len(must) <= width:  # what must stay fits: the whole table does
        assert all(cell_len(line.rstrip()) <= width for line in lines), lines
    empty = [i for i in range(1, len(columns)) if all(r[i].strip() in ("", "0", "-") for r in rows)]
    dropped_full = [i for i in range(len(columns)) if i not in shown and i not in empty]
    if dropped_full:  # a column with something in it went only after every empty one that could go
        assert not [i for i in empty if i in shown and not columns[i].keep]


@given(st.text(min_size=1, max_size=80), st.integers(3, 60))
def test_a_name_shortened_in_the_middle_keeps_both_ends(text: str, limit: int) -> None:
    short = clip_middle(text, limit)
    assert cell_len(short) <= limit
    if short != text:
        head, tail = short.split("…", 1) if "…" in short else (short, "")
        assert text.startswith(head.rstrip()) and text.endswith(tail)


def _run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, width: int, *args: str) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(width))
    capsys.readouterr()
    assert main(list(args)) in (0, 1), args  # audit exits 1 when it finds drift
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(cell_len(line.rstrip()) <= width for line in lines), (width, args, lines)
    return lines


@pytest.mark.parametrize("width", WIDTHS)
def test_every_report_table_fits_with_its_key_figures(
    width: int, backend_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = asyncio.run(build_ledger(backend_url, lambda database: seed_fit_ledger(database, long_run=True)))
    runs = _run(capsys, monkeypatch, width, "report", "runs", "--db", db)
    header = runs[1].split()
    assert {"run", "calls", "output", "wall_s", "tok/s"} <= set(header), header  # issue #54: wall_s, tok/s dropped
    (long_line,) = [line for line in runs if line.split() and line.split()[0].startswith("nightly-")]
    head, tail = long_line.split()[0].split("…")
    assert LONG_RUN.startswith(head) and LONG_RUN.endswith(tail) and len(head) >= 8
    eras = _run(capsys, monkeypatch, width, "report", "eras", "--by", "model", "--db", db)
    assert {"group", "runs", "tok/s"} <= set(eras[1].split())
    tickers = _run(capsys, monkeypatch, width, "report", "tickers", "--db", db)
    assert {"run", "ticker", "output"} <= set(tickers[1].split())
    daily = _run(capsys, monkeypatch, width, "report", "daily", "--tz", "UTC", "--db", db)
    assert {"day", "calls", "output"} <= set(daily[1].split())
    _run(capsys, monkeypatch, width, "report", "daily", "--weekday-mean", "--db", db)
    shown = _run(capsys, monkeypatch, width, "show", "run", "alpha", "--db", db)
    assert any(line.split()[:1] == ["a1"] for line in shown)
    _run(capsys, monkeypatch, width, "reconcile", "--db", db)
    _run(capsys, monkeypatch, width, "audit", "alpha", "--against", "beta", "--db", db)
    compare = _run(capsys, monkeypatch, width, "compare", "alpha", "beta", "--db", db)
    assert any("batch_aggregate" in line for line in compare)


def test_a_zero_only_column_goes_before_throughput() -> None:
    """`report runs` at 80 columns kept `truncated` (all zeros) and dropped `wall_s` and `tok/s` (issue #54)."""
    names = ["run", "calls", "truncated", "input", "output", "wall_s", "tok/s", "accept", "reconciled"]
    columns = [Column(names[0])] + [
        Column(n, numeric=True, priority=p, keep=n == "tok/s")
        for n, p in zip(names[1:], (70, 30, 60, 80, 90, 0, 50, 40), strict=True)
    ]
    rows = [["moe-2026-12-07T02-55-00", "1,700", "0", "21,016,340", "2,492,493", "93.5", "26,657", "0.712", "True"]]
    lines, shown = _render(columns, rows, 80)
    assert [names[i] for i in shown][:1] == ["run"] and "truncated" not in [names[i] for i in shown]
    assert {"wall_s", "tok/s", "output"} <= {names[i] for i in shown}
    assert all(cell_len(line.rstrip()) <= 80 for line in lines)


def _demo_ledger(path: Path) -> list[DemoRun]:
    """Two boxes' runs named as the demo names them, with the demo's orders of magnitude (millions of tokens)."""
    runs = []
    events: list[NewEvent] = []
    for box, (profile, calls) in zip(("moe", "dense"), ((PLAN[0], 40), (PLAN[1], 8)), strict=True):
        run = f"{box}-2026-12-07T02-55-00"
        for i in range(calls):
            events += [
                started(f"{box}{i}", i, run=run, ticker=f"T{i % 9}", model=profile.model),
                finished(f"{box}{i}", i, i + 90.5, prompt=12_363_000 // calls, completion=2_492_493 // calls),
            ]
        result = WorkloadResult(calls=calls, failed=0, streamed=2, prompt_tokens=1, completion_tokens=1)
        runs.append(DemoRun(run=run, profile=profile, tickers=9, result=result, wall_s=90.0, emulated_s=2741.0))

    asyncio.run(build_ledger(f"sqlite:///{path}", lambda database: _seed(database, events)))
    return runs


async def _seed(database: Database, events: list[NewEvent]) -> None:
    await append(database, *events)
    await catch_up_all(database)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_demos_tables_fit_with_their_figures(width: int, tmp_path: Path) -> None:
    """At 80 columns the demo's tables once showed "21,0…" and "aggr…" (issue #54)."""
    runs = _demo_ledger(tmp_path / "demo.db")

    async def reports() -> Reports:
        database = open_database(f"sqlite:///{tmp_path / 'demo.db'}", null_pool=True)
        try:
            return await read_reports(database, runs, "UTC")
        finally:
            await database.dispose()

    out = io.StringIO()
    console = Console(file=out, width=width, soft_wrap=False)
    print_reports(DemoOptions(db_path=tmp_path / "demo.db"), 30.0, runs, [], asyncio.run(reports()), console)
    lines = out.getvalue().splitlines()
    assert all(cell_len(line.rstrip()) <= width for line in lines), [x for x in lines if cell_len(x.rstrip()) > width]
    text = out.getvalue()
    assert not re.search(r"(?<![\w-])[\d,.]+…", text)  # no figure cut ("21,0…")
    assert not re.search(r"\b[a-z/-]+…(\s|$)", text)  # nor a header ("aggr…")
    assert "aggregate" in text and "per-call" in text and "2.49M" in text
