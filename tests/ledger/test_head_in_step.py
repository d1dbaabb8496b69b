"""The head row against the events (issue #52, 8): `verify` compares `ledger_head` with the last event, and a
gateway refuses to start on a head out of step, on both backends.

Before: a tail cut with the head row left, or a moved head row, passed `verify`, and the next append went into
the gap (or was refused only on PostgreSQL, only once appending)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from tests.gateway import processes
from tests.ledger.helpers import build_ledger, call_events
from tests.ledger.test_tamper import DROP_TRIGGERS
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.errors import LedgerError
from usage_ledger.ledger.verify import require_head_in_step, verify_chain
from usage_ledger.ledger.verify_ledger import verify_ledger


async def _seed(database: Database, calls: int = 5) -> None:
    for index in range(calls):
        await append_events(database, call_events(index))


async def _execute(database: Database, *statements: str) -> None:
    async with database.engine.begin() as conn:
        for statement in statements:
            await conn.exec_driver_sql(statement)


async def test_a_tail_cut_with_the_head_row_left_fails_verify(database: Database) -> None:
    await _seed(database)
    await _execute(database, *DROP_TRIGGERS[database.backend])
    await _execute(database, "DELETE FROM ledger_events WHERE position >= 9")
    report = await verify_ledger(database)
    assert not report.ok and not report.chain_ok
    assert report.first_bad_position == 9 and report.checked == 8
    assert (
        report.problem is not None and "ledger_head says 10:" in report.problem and "cut from the end" in report.problem
    )
    with pytest.raises(LedgerError, match="out of step with its head row"):
        await require_head_in_step(database)


@pytest.mark.parametrize(
    ("statement", "first_bad", "what"),
    [
        ("UPDATE ledger_head SET position = 7, hash = (SELECT hash FROM ledger_events WHERE position = 7)", 8, "back"),
        ("UPDATE ledger_head SET position = 12", 11, "cut from the end"),
        ("UPDATE ledger_head SET hash = (SELECT hash FROM ledger_events WHERE position = 3)", 10, "edited"),
    ],
)
async def test_a_moved_head_row_fails_verify(database: Database, statement: str, first_bad: int, what: str) -> None:
    await _seed(database)
    await _execute(database, statement)
    report = await verify_chain(database)
    assert not report.ok and report.first_bad_position == first_bad, report
    assert report.problem is not None and what in report.problem
    with pytest.raises(LedgerError, match="out of step with its head row"):
        await require_head_in_step(database)


async def test_an_empty_ledger_and_an_intact_one_are_in_step(database: Database) -> None:
    await require_head_in_step(database)
    assert (await verify_chain(database)).ok
    await _seed(database, 2)
    await require_head_in_step(database)
    assert (await verify_chain(database)).ok


def test_the_gateway_refuses_to_start_on_a_head_out_of_step(backend_url: str, tmp_path: Path) -> None:
    async def tamper(database: Database) -> None:
        await _seed(database)
        await _execute(database, *DROP_TRIGGERS[database.backend])
        await _execute(database, "DELETE FROM ledger_events WHERE position = 10")

    asyncio.run(build_ledger(backend_url, tamper))
    result = subprocess.run(
        [processes.LEDGER, "serve", "--db", backend_url, "--port", str(processes.free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    assert result.returncode == 2, result.stderr
    assert "out of step with its head row" in result.stderr and "cut from the end" in result.stderr

    async def count() -> int:
        database = open_database(backend_url, null_pool=True)
        try:
            report = await verify_chain(database)
        finally:
            await database.dispose()
        return report.checked

    assert asyncio.run(count()) == 9  # nothing appended into the gap
