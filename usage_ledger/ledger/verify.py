"""Verifying the hash chain from stored bytes: positions 1..N without gaps, every hash recomputed.

Catches an edited payload or column, a deleted row, swapped rows and an inserted row, whether or
not the triggers were bypassed. (Cutting rows off the *end* leaves a shorter valid chain: compare
the head with an anchor kept elsewhere, e.g. `--expect-head POSITION:HASH`.)
"""

from __future__ import annotations

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.chain import GENESIS_HASH, chain_hash
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import decode_event, event_type
from usage_ledger.ledger.schema import events

__all__ = ("ChainReport", "verify_chain", "verify_chain_on")


class ChainReport(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    checked: int
    head_position: int
    head_hash: str
    first_bad_position: int | None = None
    problem: str | None = None


async def verify_chain(
    database: Database, page_size: int = 10_000, expect_head: tuple[int, str] | None = None
) -> ChainReport:
    """Verify the whole chain in one read transaction (a consistent snapshot)."""
    async with database.engine.connect() as conn:
        return await verify_chain_on(conn, page_size, expect_head)


async def verify_chain_on(
    conn: AsyncConnection, page_size: int = 10_000, expect_head: tuple[int, str] | None = None
) -> ChainReport:
    """Verify the chain as `conn` sees it (tests use this to verify inside a rolled-back transaction)."""
    previous = GENESIS_HASH
    expected_position = 1
    checked = 0
    columns = (
        events.c.position,
        events.c.event_id,
        events.c.type,
        events.c.stream,
        events.c.occurred_at,
        events.c.payload,
        events.c.hash,
    )
    after = 0
    while True:
        query = select(*columns).where(events.c.position > after).order_by(events.c.position).limit(page_size)
        rows = (await conn.execute(query)).all()
        for position, event_id, type_, stream, occurred_at, payload, stored_hash in rows:
            problem = None
            if position != expected_position:
                problem = (
                    f"position {expected_position} is missing (next row is {position}): a row was deleted"
                    if position > expected_position
                    else f"unexpected position {position}"
                )
                bad = expected_position
            else:
                bad = position
                recomputed = chain_hash(previous, position, event_id, occurred_at, type_, stream, payload)
                if recomputed != stored_hash:
                    problem = "hash mismatch: the row was edited, moved or inserted"
                else:
                    problem = _payload_problem(type_, payload)
            if problem is not None:
                return ChainReport(
                    ok=False,
                    checked=checked,
                    head_position=expected_position - 1,
                    head_hash=previous,
                    first_bad_position=bad,
                    problem=problem,
                )
            previous = stored_hash
            expected_position += 1
            checked += 1
        if len(rows) < page_size:
            break
        after = rows[-1][0]
    head = expected_position - 1
    if expect_head is not None and (head, previous) != expect_head:
        position, digest = expect_head
        return ChainReport(
            ok=False,
            checked=checked,
            head_position=head,
            head_hash=previous,
            first_bad_position=min(position, head + 1),
            problem=f"head is {head}:{previous}, the anchor says {position}:{digest} (rows cut from the end?)",
        )
    return ChainReport(ok=True, checked=checked, head_position=head, head_hash=previous)


def _payload_problem(type_: str, payload: str) -> str | None:
    try:
        body = decode_event(payload)
    except msgspec.DecodeError as exc:
        return f"payload does not decode as a ledger event: {exc}"
    if event_type(body) != type_:
        return f"type column {type_!r} disagrees with the payload's {event_type(body)!r}"
    return None
