"""Verifying the event table from stored bytes: positions 1..N without gaps, every hash recomputed,
every `recorded_at` plausible (within the clock skew of its neighbours), and the `ledger_head` row naming the
last row (`head_problem`). What each check catches and what it cannot: docs/auditing.md, "What `ledger verify`
covers".
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.append import as_ledger_errors
from usage_ledger.ledger.chain import GENESIS_HASH, chain_hash
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import LedgerError
from usage_ledger.ledger.events import Event, decode_event, event_type, utc_now
from usage_ledger.ledger.read import STORED_COLUMNS
from usage_ledger.ledger.schema import events, head

__all__ = (
    "CLOCK_SKEW",
    "ChainObserver",
    "ChainReport",
    "head_problem",
    "require_head_in_step",
    "snapshot",
    "verify_chain",
    "verify_chain_on",
)

CLOCK_SKEW = timedelta(seconds=120)
"""How far clocks may disagree: SQLite takes `recorded_at` before waiting up to 30 s for the write
lock, so two processes can commit slightly out of clock order; several gateways share PostgreSQL."""


class ChainReport(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    checked: int
    head_position: int
    head_hash: str
    first_bad_position: int | None = None
    problem: str | None = None


class ChainObserver(Protocol):
    """Sees every row that verified, in position order (blob references, checkpoint digests)."""

    def row(self, position: int, event_id: uuid.UUID, stored_hash: str, recorded_at: datetime, body: Event) -> None: ...


async def verify_chain(database: Database, expect_head: tuple[int, str] | None = None) -> ChainReport:
    """Verify the whole chain in one read transaction (a consistent snapshot)."""
    conn = await snapshot(database)
    try:
        return await verify_chain_on(conn, expect_head=expect_head)
    finally:
        await conn.close()


async def snapshot(database: Database) -> AsyncConnection:
    """A read connection whose statements all see one snapshot (REPEATABLE READ on PostgreSQL;
    SQLite's BEGIN holds its WAL snapshot from the first read): the events and the head row agree in it."""
    return await database.backend_ops.snapshot(await database.engine.connect())


async def verify_chain_on(
    conn: AsyncConnection,
    page_size: int = 10_000,
    expect_head: tuple[int, str] | None = None,
    *,
    clock_skew: timedelta = CLOCK_SKEW,
    observers: Sequence[ChainObserver] = (),
) -> ChainReport:
    """Verify the chain as `conn` sees it, and that the head row names its last row (`conn` must see one
    snapshot: `snapshot`; tests verify inside a rolled-back transaction)."""
    previous = GENESIS_HASH
    expected_position = 1
    checked = 0
    clocks = _RecordedClock(clock_skew)
    after = 0
    while True:
        query = select(*STORED_COLUMNS).where(events.c.position > after).order_by(events.c.position).limit(page_size)
        rows = (await conn.execute(query)).all()
        for position, event_id, type_, stream, occurred_at, recorded_at, payload, stored_hash in rows:
            problem = None
            body: Event | None = None
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
                    body, problem = _decode_payload(type_, payload)
                    if problem is None:
                        problem = clocks.problem(position, type_, occurred_at, recorded_at)
            if problem is not None:
                return _broken(checked, expected_position - 1, previous, bad, problem)
            if body is not None:
                for observer in observers:
                    observer.row(position, event_id, stored_hash, recorded_at, body)
            previous = stored_hash
            expected_position += 1
            checked += 1
        if len(rows) < page_size:
            break
        after = rows[-1][0]
    last = expected_position - 1
    out_of_step = await head_problem(conn, last, previous)
    if out_of_step is not None:
        return _broken(checked, last, previous, *out_of_step)
    if expect_head is not None and (last, previous) != expect_head:
        position, digest = expect_head
        problem = f"head is {last}:{previous}, the anchor says {position}:{digest} (rows cut from the end?)"
        return _broken(checked, last, previous, min(position, last + 1), problem)
    return ChainReport(ok=True, checked=checked, head_position=last, head_hash=previous)


def _broken(checked: int, head_position: int, head_hash: str, first_bad_position: int, problem: str) -> ChainReport:
    return ChainReport(
        ok=False,
        checked=checked,
        head_position=head_position,
        head_hash=head_hash,
        first_bad_position=first_bad_position,
        problem=problem,
    )


async def head_problem(conn: AsyncConnection, last_position: int, last_hash: str) -> tuple[int, str] | None:
    """(first bad position, what is wrong) when the `ledger_head` row, which the next append chains onto, does
    not name the last stored event (`last_position` 0 and the genesis hash when there is none); else None."""
    row = (await conn.execute(select(head.c.position, head.c.hash).where(head.c.id == 1))).first()
    if row is None:
        return last_position + 1, "the ledger has no head row (ledger_head): run `ledger db upgrade`"
    position, digest = int(row.position), str(row.hash)
    if (position, digest) == (last_position, last_hash):
        return None
    said = f"ledger_head says {position}:{digest}, the last event is {last_position}:{last_hash}"
    if position > last_position:
        return last_position + 1, f"{said}: events were cut from the end (the next append would leave a gap)"
    if position < last_position:
        return position + 1, f"{said}: the head row was moved back (the next append would collide with stored events)"
    return position, f"{said}: the head row was edited (the next append would fork the chain)"


async def require_head_in_step(database: Database) -> None:
    """Raise `LedgerError` unless the head row names the last stored event (a gateway checks this at start:
    appending onto a head out of step would write a gap or a fork into the chain). Reads two rows only."""
    with as_ledger_errors(database):
        conn = await snapshot(database)
    try:
        with as_ledger_errors(database):
            tail = (
                await conn.execute(select(events.c.position, events.c.hash).order_by(events.c.position.desc()).limit(1))
            ).first()
            last = (int(tail.position), str(tail.hash)) if tail is not None else (0, GENESIS_HASH)
            out_of_step = await head_problem(conn, *last)
    finally:
        await conn.close()
    if out_of_step is not None:
        raise LedgerError(
            f"the ledger {database.safe_url} is out of step with its head row: {out_of_step[1]}; run `ledger verify` "
            "and repair it before appending (docs/operations.md, Several gateways)"
        )


class _RecordedClock:
    """The plausibility rules for `recorded_at`, which the chain hash does not cover."""

    def __init__(self, skew: timedelta) -> None:
        self.skew = skew
        self.latest: datetime | None = None
        self.latest_position = 0
        self.now = utc_now()

    def problem(self, position: int, type_: str, occurred_at: datetime, recorded_at: datetime) -> str | None:
        if recorded_at > self.now + self.skew:
            return f"recorded_at {recorded_at.isoformat()} is in the future: the column was edited"
        if self.latest is not None and recorded_at < self.latest - self.skew:
            return (
                f"recorded_at {recorded_at.isoformat()} is before position {self.latest_position}'s "
                f"{self.latest.isoformat()} by more than {self.skew.total_seconds():g} s: the column was edited"
            )
        # an import's occurred_at is a time from its file (possibly mislabelled local time): no rule
        if type_ != "call.imported" and recorded_at < occurred_at - self.skew:
            return (
                f"recorded_at {recorded_at.isoformat()} is before the event occurred ({occurred_at.isoformat()}): "
                "the column was edited"
            )
        if self.latest is None or recorded_at > self.latest:
            self.latest, self.latest_position = recorded_at, position
        return None


def _decode_payload(type_: str, payload: str) -> tuple[Event | None, str | None]:
    try:
        body = decode_event(payload)
    except msgspec.DecodeError as exc:
        return None, f"payload does not decode as a ledger event: {exc}"
    if event_type(body) != type_:
        return None, f"type column {type_!r} disagrees with the payload's {event_type(body)!r}"
    return body, None
