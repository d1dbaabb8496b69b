"""`ledger ui` refuses a ledger that is not there (leaving no empty file behind) or not migrated."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from usage_ledger.cli import main


def test_a_missing_sqlite_ledger_is_refused_and_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nowhere.db"
    assert main(["ui", "--db", f"sqlite:///{path}"]) == 2
    assert not path.exists()
    assert f"no ledger at {path}" in capsys.readouterr().err


def test_a_ledger_never_upgraded_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    assert main(["ui", "--db", f"sqlite:///{path}"]) == 2
    assert "ledger db upgrade" in capsys.readouterr().err
