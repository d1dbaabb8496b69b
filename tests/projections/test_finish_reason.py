"""A call's finish reason (choice 0's) and a run's truncated calls, from gateway events and imports."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from tests.projections.helpers import append, at, failed, finished, started
from usage_ledger.answers.reports import runs_report
from usage_ledger.cli import main
from usage_ledger.imports.importer import import_file
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallImported, new_event
from usage_ledger.projections.engine import catch_up
from usage_ledger.projections.rebuild import rebuild_projection
from usage_ledger.projections.tables import calls


async def _reasons(database: Database) -> dict[str, str | None]:
    await catch_up(database, "calls")
    async with database.engine.connect() as conn:
        rows = await conn.execute(select(calls.c.call_id, calls.c.finish_reason).where(calls.c.version == 1))
        return {r[0]: r[1] for r in rows}


async def test_the_row_takes_choice_zeros_reason_else_the_first(database: Database) -> None:
    await append(
        database,
        *(started(c, 0, run="r") for c in ("stop", "cut", "n2", "old", "none", "gone", "resp")),
        finished("stop", 0, 1, reasons=("stop",), choices=(0,)),
        finished("cut", 0, 1, reasons=("length",), choices=(0,)),
        finished("n2", 0, 1, reasons=("stop", "length"), choices=(1, 0)),  # choice 1 ended first
        finished("old", 0, 1, reasons=("tool_calls", "stop")),  # recorded before the choice index
        finished("none", 0, 1),
        failed("gone", 0, 1),
        finished("resp", 0, 1, reasons=("max_output_tokens",), choices=(0,)),  # the Responses API
    )
    assert await _reasons(database) == {
        "stop": "stop",
        "cut": "length",
        "n2": "length",
        "old": "tool_calls",
        "none": None,
        "gone": None,
        "resp": "max_output_tokens",
    }
    (row,) = await runs_report(database)
    assert row.truncated_calls == 3  # cut, n2 (choice 0: length) and resp (max_output_tokens)


async def test_truncated_calls_is_null_where_no_call_of_the_run_says(database: Database) -> None:
    await append(
        database,
        started("a", 0, run="silent"),
        finished("a", 0, 1),
        started("b", 0, run="said"),
        finished("b", 0, 1, reasons=("stop",), choices=(0,)),
        started("c", 5000),  # untagged: a gap-cut run
        finished("c", 5000, 5001, reasons=("length",), choices=(0,)),
        started("d", 5000),
        finished("d", 5000, 5001),
    )
    rows = {r.run: r for r in await runs_report(database)}
    assert rows["silent"].truncated_calls is None
    assert rows["said"].truncated_calls == 0
    (auto,) = [r for name, r in rows.items() if name.startswith("auto-")]
    assert auto.truncated_calls == 1


async def test_imports_carry_an_optional_finish_reason(database: Database, tmp_path: Path) -> None:
    source = tmp_path / "calls.jsonl"
    source.write_text(
        '{"run": "imp", "started_at": "2026-03-01T13:00:00Z", "elapsed_s": 3, "input_tokens": 10,'
        ' "output_tokens": 5, "call_id": "i1", "finish_reason": "length"}\n'
        '{"run": "imp", "started_at": "2026-03-01T13:00:01Z", "elapsed_s": 3, "input_tokens": 10,'
        ' "output_tokens": 5, "call_id": "i2"}\n'
    )
    await import_file(database, source)
    csv = tmp_path / "calls.csv"
    csv.write_text(
        "run,started_at,elapsed_s,input_tokens,output_tokens,call_id,finish_reason\n"
        "imp,2026-03-01T13:00:02Z,3,10,5,i3,stop\nimp,2026-03-01T13:00:03Z,3,10,5,i4,\n"
    )
    await import_file(database, csv)
    reasons = await _reasons(database)
    assert reasons["i1"] == "length" and reasons["i2"] is None and reasons["i3"] == "stop"
    assert reasons["i4"] in (None, "")
    (row,) = await runs_report(database)
    assert row.truncated_calls == 1


async def test_report_runs_is_the_same_after_a_rebuild(database: Database) -> None:
    imported = CallImported(
        call_id="imp",
        source="s",
        line=1,
        started_at=at(0),
        finished_at=at(5),
        input_tokens=10,
        output_tokens=5,
        run="r",
        finish_reason="length",
    )
    await append(
        database,
        started("a", 0, run="r", ticker="T"),
        finished("a", 0, 10, completion=100, reasons=("length",), choices=(0,)),
        new_event(imported, stream="call-imp"),
        started("b", 3000),
        finished("b", 3000, 3001, reasons=("stop",), choices=(0,)),
    )
    before = await runs_report(database)
    await rebuild_projection(database, "calls")
    assert await runs_report(database) == before


def test_report_runs_prints_the_same_bytes_after_a_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ledger report runs` (table, JSON, CSV) byte for byte before and after `ledger rebuild`."""
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    source = tmp_path / "calls.jsonl"
    source.write_text(
        "".join(
            f'{{"run": "r{i % 3}", "ticker": "T{i % 5}", "started_at": {1_770_000_000 + 7 * i}, "elapsed_s": 5,'
            f' "input_tokens": {100 + i}, "output_tokens": {10 + i % 4}, "finish_reason": "{("stop", "length")[i % 2]}"}}\n'
            for i in range(30)
        )
    )
    assert main(["db", "upgrade", "--db", db]) == 0
    assert main(["import", str(source), "--db", db]) == 0

    def reports() -> list[str]:
        out = []
        for fmt in ("table", "json", "csv"):
            capsys.readouterr()
            assert main(["report", "runs", "--db", db, "--format", fmt]) == 0
            out.append(capsys.readouterr().out)
        return out

    before = reports()
    assert '"truncated_calls":' in before[1]
    capsys.readouterr()
    assert main(["rebuild", "--db", db]) == 0
    assert reports() == before
