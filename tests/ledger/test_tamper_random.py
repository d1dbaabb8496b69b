"""Many random tamperings, each inside a rolled-back transaction with the triggers dropped:
`verify_chain_on` must catch every edit, deletion, swap and insertion, at the right position."""

from __future__ import annotations

import random
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.ledger.helpers import call_events
from tests.ledger.test_tamper import DROP_TRIGGERS
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.verify import verify_chain_on

ROWS = 40
ROUNDS = 60


async def _tamper(conn: AsyncConnection, rng: random.Random, backend: str) -> int:
    """Apply one random tampering; return the first position that must be reported bad."""
    kind = rng.choice(("edit_payload", "edit_stream", "delete", "swap", "insert"))
    a = rng.randint(1, ROWS - 1)
    run = conn.exec_driver_sql
    if kind == "edit_payload":
        await run(
            f'UPDATE ledger_events SET payload = replace(payload, \'"call_id":"\', \'"call_id":"x\') WHERE position = {a}'
        )
        return a
    if kind == "edit_stream":
        await run(f"UPDATE ledger_events SET stream = stream || 'x' WHERE position = {a}")
        return a
    if kind == "delete":
        await run(f"DELETE FROM ledger_events WHERE position = {a}")
        return a
    if kind == "swap":
        b = rng.randint(a + 1, ROWS)
        await run(f"UPDATE ledger_events SET position = -1 WHERE position = {a}")
        await run(f"UPDATE ledger_events SET position = {a} WHERE position = {b}")
        await run(f"UPDATE ledger_events SET position = {b} WHERE position = -1")
        return a
    # insert: shift rows >= a up by one, copy another row (hash and all) into the hole
    for position in range(ROWS, a - 1, -1):
        await run(f"UPDATE ledger_events SET position = {position + 1} WHERE position = {position}")
    source = rng.choice([p for p in range(1, ROWS + 2) if p != a])
    forged = uuid.uuid4().hex if backend == "sqlite" else str(uuid.uuid4())
    await run(
        "INSERT INTO ledger_events (position, event_id, type, stream, occurred_at, recorded_at, payload, hash) "
        f"SELECT {a}, '{forged}', type, stream, occurred_at, recorded_at, payload, hash "
        f"FROM ledger_events WHERE position = {source}"
    )
    return a


@pytest.mark.slow
async def test_random_tampering_is_always_caught(database: Database) -> None:
    for index in range(ROWS // 2):
        await append_events(database, call_events(index))
    rng = random.Random(20261130)
    async with database.engine.connect() as conn:
        for _ in range(ROUNDS):
            async with conn.begin() as transaction:
                for statement in DROP_TRIGGERS[database.backend]:
                    await conn.exec_driver_sql(statement)
                assert (await verify_chain_on(conn)).ok
                expected = await _tamper(conn, rng, database.backend)
                report = await verify_chain_on(conn)
                assert not report.ok and report.first_bad_position == expected, report
                await transaction.rollback()
        assert (await verify_chain_on(conn)).ok  # the real chain was never touched
