"""The SQLite bulk load's child process: a current SQLite, read-only on the ledger, errors reported."""

from __future__ import annotations

import contextlib
import io
import sqlite3
from pathlib import Path

import pytest

from tests.projections.helpers import append, append_plain_calls, failed, finished, started
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.errors import LedgerError
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.projections._bulk import _run_sqlite_prepare
from usage_ledger.projections._sqlite_prepare import ROWS_FILES, ScanProgress, _driver, prepare


def test_the_child_uses_a_sqlite_with_the_fast_json_parser() -> None:
    assert _driver().sqlite_version_info >= (3, 45)


async def test_a_failing_child_is_reported_with_its_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.db"
    with pytest.raises(LedgerError, match=r"nowhere\.db for the bulk load failed: OperationalError: unable to open"):
        await _run_sqlite_prepare(str(missing), tmp_path, 10)
    assert not missing.exists()  # read-only: not even created


def test_prepare_writes_only_its_work_files(tmp_path: Path) -> None:
    (tmp_path / "a #?%b").mkdir()
    ledger = tmp_path / "a #?%b" / "ledger.db"  # read through a file: URI, so quoted
    # just the columns the statements read; closed before `prepare` opens the file with its own SQLite
    with contextlib.closing(sqlite3.connect(ledger)) as conn:
        conn.execute("CREATE TABLE ledger_events (position INTEGER PRIMARY KEY, type TEXT, payload TEXT)")
    before = ledger.read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    rows = prepare(str(ledger), work, 0)
    assert sorted(p.name for p in work.iterdir()) == sorted(p.name for p in rows) == sorted(ROWS_FILES)
    assert ledger.read_bytes() == before


def _contents(path: Path, tables: tuple[str, ...]) -> dict[str, list[tuple[object, ...]]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall() for table in tables}


async def test_the_workers_on_two_processes_write_what_the_threads_write(tmp_path: Path) -> None:
    """A big ledger is scanned and its rows written by two processes, a small one on threads and here.
    Both give the same files, the rows split in halves at one call id, the unusual calls left to the
    fold, and the processes' progress reaches the bar."""
    ledger = tmp_path / "ledger.db"
    database = open_database(f"sqlite:///{ledger}")
    await upgrade_database(database)
    try:
        await append_plain_calls(database, 600)  # 1,200 positions: the scans call out at 1,024
        await append(
            database,
            finished("orphan", 1, 2),  # an end without a start: position 1,201
            finished("early", 3, 4),  # the end before the start
            started("early", 3),
            started("twice", 4),
            started("twice", 5),  # a repeated start
            finished("twice", 5, 6),
            started("open", 6),  # no end yet
            failed("down", 6, 7),  # a failure without a start: position 1,208
        )
        head = 1_208
    finally:
        await database.dispose()
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    on_threads = prepare(str(ledger), here, head)
    lines = io.StringIO()
    on_processes = prepare(str(ledger), there, head, ScanProgress(head, lines, interval_s=0), processes_from=head)
    lower = _contents(on_threads[0], ("rebuild_rows", "rebuild_rest"))
    upper = _contents(on_threads[1], ("rebuild_rows",))
    assert lower == _contents(on_processes[0], ("rebuild_rows", "rebuild_rest"))
    assert upper == _contents(on_processes[1], ("rebuild_rows",))
    ids = [row[0] for row in lower["rebuild_rows"] + upper["rebuild_rows"]]
    assert ids == sorted(ids) and len(lower["rebuild_rows"]) == len(upper["rebuild_rows"]) == 302
    assert len(ids) == 600 + 4 and ids.count("twice") == 2  # every start a row; two for the repeated one
    # left to the Python fold, by their positions: the orphan end, early, twice, the failure without a start
    assert sorted(row[1] for row in lower["rebuild_rest"]) == ["1201", "1203,1202", "1204,1205,1206", "1208"]
    seen = [tuple(map(int, line.split()[1:])) for line in lines.getvalue().splitlines()]
    assert seen[-1] == (head, head) and all(total == head for _, total in seen)
    assert any(0 < done < head for done, _ in seen)  # a scan's note, from its process, before the end
