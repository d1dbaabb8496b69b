"""Verifying the event table from stored bytes: positions 1..N without gaps, every hash recomputed,
every `recorded_at` plausible.

Catches an edited payload or column, a deleted row, swapped rows and an inserted row, whether or
not the triggers were bypassed. `recorded_at` is not in the chain hash (the formula of stored
events cannot change), so it is checked against its neighbours instead: never more than the clock
skew before an earlier row's `recorded_at` or before its own `occurred_at` (imports excepted: their
`occurred_at` is history), never after now. A signed checkpoint commits to every `recorded_at` up
to its size exactly (`verify_ledger`). Cutting rows off the *end* leaves a shorter valid chain:
compare the head with an anchor kept elsewhere (`--expect-head`, or a signed checkpoint).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Protocol

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.chain import GENESIS_HASH, chain_hash
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import Event, decode_event, event_type, utc_now
from usage_ledger.ledger.read import STORED_COLUMNS
from usage_ledger.ledger.schema import events

__all__ = ("CLOCK_SKEW", "ChainObserver", "ChainReport", "verify_chain", "verify_chain_on")

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


async def verify_chain(
    database: Database,
    page_size: int = 10_000,
    expect_head: tuple[int, str] | None = None,
    *,
    clock_skew: timedelta = CLOCK_SKEW,
) -> ChainReport:
    """Verify the whole chain in one read transaction (a consistent snapshot)."""
    async with database.engine.connect() as conn:
        return await verify_chain_on(conn, page_size, expect_head, clock_skew=clock_skew)


async def verify_chain_on(
    conn: AsyncConnection,
    page_size: int = 10_000,
    expect_head: tuple[int, str] | None = None,
    *,
    clock_skew: timedelta = CLOCK_SKEW,
    observer: ChainObserver | None = None,
) -> ChainReport:
    """Verify the chain as `conn` sees it (tests use this to verify inside a rolled-back transaction)."""
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
                return ChainReport(
                    ok=False,
                    checked=checked,
                    head_position=expected_position - 1,
                    head_hash=previous,
                    first_bad_position=bad,
                    problem=problem,
                )
            if observer is not None and body is not None:
                observer.row(position, event_id, stored_hash, recorded_at, body)
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
