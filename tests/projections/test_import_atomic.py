"""`ledger import` is atomic per file (issue #40): a kill -9 or a database error while it appends leaves
none of the file in the ledger and the chain intact; the same import again appends all of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

import usage_ledger.imports.importer as importer
from tests.ledger.helpers import allow_inserts, refuse_inserts
from usage_ledger.imports.importer import import_file
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import LedgerError
from usage_ledger.ledger.read import head_position
from usage_ledger.ledger.verify import verify_chain

LEDGER = [sys.executable, "-m", "usage_ledger.cli"]
ROWS = 1_000
BATCH = 50  # the importer's batch in these tests: the file is 20 of them

# `ledger import` as the CLI runs it, with small batches; after the third batch of the second pass
# (the append) it says so on stdout and waits, so the test kills it there and not after the commit.
IMPORT_AND_STALL = textwrap.dedent(
    """
    import sys
    import usage_ledger.commands.reports as reports
    import usage_ledger.imports.importer as importer
    from usage_ledger.cli import main

    importer._BATCH = int(sys.argv[3])
    real = reports.import_file
    batches = 0

    def progress(done, total):
        global batches
        if total // 2 < done < total:  # a batch of the second pass was appended
            batches += 1
            if batches == 3:
                print("appended 3 batches", flush=True)
                sys.stdin.readline()  # wait here to be killed

    async def import_file(*args, **kwargs):
        return await real(*args, **{**kwargs, "progress": progress})

    reports.import_file = import_file
    sys.exit(main(["import", sys.argv[2], "--db", sys.argv[1]]))
    """
)


def _write(path: Path, rows: int, run: str = "atomic", **extra: object) -> Path:
    t0 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC)
    with path.open("wb") as out:
        for i in range(rows):
            row = {
                "started_at": (t0 + timedelta(seconds=i * 10)).isoformat(),
                "elapsed_s": 5,
                "input_tokens": 100 + i,
                "output_tokens": 10,
                "run": run,
                **(extra if i == rows * 3 // 5 else {}),
            }
            out.write(msgspec.json.encode(row) + b"\n")
    return path


async def _head(database: Database) -> int:
    async with database.engine.connect() as conn:
        return await head_position(conn)


async def test_kill_9_mid_import_leaves_none_of_the_file(database: Database, tmp_path: Path) -> None:
    before = await import_file(database, _write(tmp_path / "earlier.jsonl", 3, run="earlier"))
    path = _write(tmp_path / "calls.jsonl", ROWS)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        IMPORT_AND_STALL,
        database.url,
        str(path),
        str(BATCH),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    try:
        said = await asyncio.wait_for(child.stdout.readline(), 120)
        assert said == b"appended 3 batches\n", (await child.stderr.read()).decode()[-2000:]
    finally:
        child.kill()  # SIGKILL: no rollback, no goodbye to the database
        await child.wait()
    assert child.returncode == -9

    assert await _head(database) == before.appended == 3
    verify = await asyncio.to_thread(_ledger, "verify", "--db", database.url)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    again = await asyncio.to_thread(_ledger, "import", str(path), "--db", database.url)
    assert again.returncode == 0, again.stderr
    assert f"{ROWS} calls imported, 0 already present" in again.stdout
    assert await _head(database) == 3 + ROWS
    assert (await verify_chain(database)).ok


async def test_a_database_error_mid_import_appends_none_of_the_file(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importer, "_BATCH", BATCH)
    await import_file(database, _write(tmp_path / "earlier.jsonl", 3, run="earlier"))
    path = _write(tmp_path / "calls.jsonl", ROWS, call_id="refused")  # in the 13th of 20 batches
    await refuse_inserts(database, "call-refused")
    with pytest.raises(LedgerError, match="refused by test"):
        await import_file(database, path)
    assert await _head(database) == 3
    assert (await verify_chain(database)).ok

    await allow_inserts(database)
    result = await import_file(database, path)
    assert (result.appended, result.duplicates) == (ROWS, 0)
    assert await _head(database) == 3 + ROWS
    assert (await verify_chain(database)).ok


def _ledger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEDGER, *args], capture_output=True, text=True, timeout=120)
