"""`ledger db current | history | downgrade REV` on both backends, and commands that look at a SQLite
ledger that was never created (`report`, `db current`, `serve`) leave no empty file behind."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect

from usage_ledger.cli import main
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.migrate import head_revision, revision_history

LEDGER = str(Path(sys.executable).parent / "ledger")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tables(url: str) -> set[str]:
    async def read() -> set[str]:
        database = open_database(url, null_pool=True)
        try:
            async with database.engine.connect() as conn:
                return await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        finally:
            await database.dispose()

    return asyncio.run(read())


def test_history_lists_every_revision_newest_first(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "db", "history")
    assert code == 0
    lines = out.splitlines()
    revisions = revision_history()
    assert len(lines) == len(revisions) >= 2
    assert lines[0].startswith(f"{revisions[0].down_revision} -> {head_revision()} (head): ")
    assert lines[-1].startswith(f"base -> {revisions[-1].revision}: Ledger core")


def test_current_upgrade_downgrade_round_trip(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    head = head_revision()
    previous = revision_history()[1].revision
    code, out, _ = _run(capsys, "db", "current", "--db", backend_url)
    assert code == 1 and ("no database file" in out or "none: not migrated" in out)

    assert _run(capsys, "db", "upgrade", "--db", backend_url)[0] == 0
    code, out, _ = _run(capsys, "db", "current", "--db", backend_url)
    assert code == 0 and out.strip().endswith(f": {head} (head)")

    code, out, _ = _run(capsys, "db", "downgrade", previous, "--db", backend_url)
    assert code == 0 and out.startswith(f"undone {head}: ")
    code, out, _ = _run(capsys, "db", "current", "--db", backend_url)
    assert code == 1 and f": {previous} (head is {head}" in out
    assert "ledger_events" in _tables(backend_url)
    code, _, err = _run(capsys, "report", "runs", "--db", backend_url)
    assert code == 2 and f"is at revision {previous}, expected {head}" in err

    code, out, _ = _run(capsys, "db", "downgrade", previous, "--db", backend_url)
    assert code == 0 and "nothing undone" in out

    # to base drops the ledger itself: only with --yes
    code, _, err = _run(capsys, "db", "downgrade", "base", "--db", backend_url)
    assert code == 2 and "every event" in err and "--yes" in err
    assert "ledger_events" in _tables(backend_url)
    code, out, _ = _run(capsys, "db", "downgrade", "base", "--yes", "--db", backend_url)
    assert code == 0 and "undone 0001" in out
    assert not {t for t in _tables(backend_url) if t.startswith(("ledger_", "projection_"))}
    code, out, _ = _run(capsys, "db", "current", "--db", backend_url)
    assert code == 1 and "none: not migrated" in out


def test_downgrade_refuses_unknown_and_newer_revisions(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "db", "upgrade", "--db", backend_url)[0] == 0
    code, _, err = _run(capsys, "db", "downgrade", "9999", "--db", backend_url)
    assert code == 2 and "unknown revision '9999'" in err and "ledger db history" in err
    previous = revision_history()[1].revision
    assert _run(capsys, "db", "downgrade", previous, "--db", backend_url)[0] == 0
    code, _, err = _run(capsys, "db", "downgrade", head_revision(), "--db", backend_url)
    assert code == 2 and "is newer than" in err and "ledger db upgrade" in err


def test_projections_come_back_after_downgrade_and_upgrade(
    backend_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.projections.seed import MOE, seed_rows, write_jsonl

    assert _run(capsys, "db", "upgrade", "--db", backend_url)[0] == 0
    seed = write_jsonl(tmp_path / "moe.jsonl", seed_rows(MOE))
    assert _run(capsys, "import", str(seed), "--db", backend_url)[0] == 0
    assert _run(capsys, "report", "runs", "--db", backend_url, "--format", "csv")[1].count("\n") == 2
    assert _run(capsys, "db", "downgrade", revision_history()[-1].revision, "--db", backend_url)[0] == 0
    assert _run(capsys, "db", "upgrade", "--db", backend_url)[0] == 0
    assert _run(capsys, "report", "runs", "--db", backend_url, "--format", "csv")[1].count("\n") == 2


def test_nothing_creates_a_sqlite_file_that_was_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "never.db"
    url = f"sqlite:///{path}"
    for args in (["report", "runs"], ["db", "current"], ["db", "downgrade", "base", "--yes"], ["verify"]):
        code, _, err = _run(capsys, *args, "--db", url)
        assert code in (1, 2), args
        assert list(tmp_path.iterdir()) == [], (args, err)
    code, _, err = _run(capsys, "report", "runs", "--db", url)
    assert "no ledger database at" in err and "ledger db upgrade" in err


def test_serve_on_a_ledger_never_upgraded_exits_and_leaves_no_file(backend_url: str, tmp_path: Path) -> None:
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    proc = subprocess.run(
        [LEDGER, "serve", "--db", backend_url, "--port", "0", "--upstream", "http://127.0.0.1:9"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "LEDGER_SPOOL_DIR": str(workdir / "spool")},
    )
    assert proc.returncode == 2, proc.stderr
    assert "ledger db upgrade" in proc.stderr
    if backend_url.startswith("sqlite"):
        assert "no ledger database at" in proc.stderr
        assert not (tmp_path / "ledger.db").exists()
        assert not list(tmp_path.glob("ledger.db*"))
