"""The SQLite bulk load's child process: a current SQLite, read-only on the ledger, errors reported."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from ledger.errors import LedgerError
from projections._bulk import _run_sqlite_prepare
from projections._sqlite_prepare import _driver, prepare


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
    assert sorted(p.name for p in work.iterdir()) == [rows.name]
    assert ledger.read_bytes() == before
