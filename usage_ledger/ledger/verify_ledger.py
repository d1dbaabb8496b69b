"""`ledger verify`: the chain, the blobs and signed checkpoints, in one consistent snapshot.

verify_ledger ─ verify_chain_on (events, every column)  ─ observers see each verified row:
              │                                           BlobReferences, _HeadCapture
              ├ audit_blobs (ledger_blobs against the verified references)
              └ each checkpoint: signature, origin, head hash and recorded-at digest at its size
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.checkpoint import (
    Checkpoint,
    HeadTracker,
    SignatureRejected,
    VerifierKey,
    derived_origin,
    open_checkpoint,
)
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import Event
from usage_ledger.ledger.schema import events
from usage_ledger.ledger.verify import CLOCK_SKEW, ChainReport, snapshot, verify_chain_on
from usage_ledger.ledger.verify_blobs import BlobReferences, BlobReport, audit_blobs

__all__ = ("CheckpointCheck", "LedgerReport", "chain_head", "ledger_origin", "verify_ledger")


class CheckpointCheck(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    ok: bool
    size: int | None = None
    problem: str | None = None


class LedgerReport(msgspec.Struct, frozen=True, kw_only=True):
    """The chain's report fields at the top (as `ledger verify --format json` always printed them),
    `ok` for everything, then the blobs and the checkpoints."""

    ok: bool
    checked: int
    head_position: int
    head_hash: str
    first_bad_position: int | None = None
    problem: str | None = None
    chain_ok: bool
    blobs: BlobReport | None
    """None when the chain is broken: references past the break are not verified."""
    checkpoints: list[CheckpointCheck] = []
    origin: str | None = None


async def verify_ledger(
    database: Database,
    *,
    expect_head: tuple[int, str] | None = None,
    checkpoints: Sequence[tuple[str, bytes]] = (),
    verifier: VerifierKey | None = None,
    origin: str | None = None,
    clock_skew: timedelta = CLOCK_SKEW,
) -> LedgerReport:
    """Verify everything `ledger verify` covers. `checkpoints` are (source name, signed note bytes);
    a malformed one raises `CheckpointMalformed` before any reading (bad input, exit code 2)."""
    if checkpoints and verifier is None:
        raise ValueError("checkpoints need the verifier key")
    results: list[CheckpointCheck] = []
    opened: list[tuple[str, Checkpoint]] = []
    for source, note in checkpoints:
        assert verifier is not None
        try:
            opened.append((source, open_checkpoint(note, verifier, source)))
        except SignatureRejected as exc:
            results.append(CheckpointCheck(source=source, ok=False, problem=str(exc)))
    capture = _HeadCapture({checkpoint.size for _, checkpoint in opened}, track=bool(opened))
    references = BlobReferences()
    try:
        conn = await snapshot(database)
        try:
            chain = await verify_chain_on(
                conn, expect_head=expect_head, clock_skew=clock_skew, observers=(references, capture)
            )
            blob_report = await audit_blobs(conn, references, clock_skew) if chain.ok else None
        finally:
            await conn.close()
    finally:
        references.close()
    ledger_id = origin or (derived_origin(capture.first_id) if capture.first_id is not None else None)
    results.extend(_check(source, cp, chain, capture, ledger_id) for source, cp in opened)
    ok = chain.ok and blob_report is not None and blob_report.ok and all(r.ok for r in results)
    return LedgerReport(
        **(msgspec.structs.asdict(chain) | {"ok": ok}),
        chain_ok=chain.ok,
        blobs=blob_report,
        checkpoints=results,
        origin=ledger_id,
    )


async def chain_head(
    conn: AsyncConnection, origin: str | None, clock_skew: timedelta = CLOCK_SKEW
) -> tuple[ChainReport, Checkpoint | None]:
    """Verify the chain and, when intact, the checkpoint of its head (unsigned) for `ledger checkpoint`."""
    tracker = _HeadCapture(set())
    report = await verify_chain_on(conn, clock_skew=clock_skew, observers=(tracker,))
    if not report.ok:
        return report, None
    name = origin or derived_origin(tracker.first_id)
    return report, tracker.tracker.checkpoint(name)


async def ledger_origin(conn: AsyncConnection) -> str:
    """The origin derived from the event at position 1 (`LEDGER_CHECKPOINT_ORIGIN` unset)."""
    first = (await conn.execute(select(events.c.event_id).where(events.c.position == 1))).scalar_one_or_none()
    return derived_origin(first)


class _HeadCapture:
    """Tracks the head and recorded-at digest, keeping them at the sizes checkpoints name."""

    def __init__(self, sizes: set[int], *, track: bool = True) -> None:
        self.tracker = HeadTracker()
        self.sizes = sizes
        self.track = track  # the digest costs a little per row: only when a checkpoint will need it
        self.first_id: uuid.UUID | None = None
        self.at: dict[int, Checkpoint] = {0: self.tracker.checkpoint("")} if 0 in sizes else {}

    def row(self, position: int, event_id: uuid.UUID, stored_hash: str, recorded_at: datetime, body: Event) -> None:
        if position == 1:
            self.first_id = event_id
        if not self.track:
            return
        self.tracker.add(position, stored_hash, recorded_at)
        if position in self.sizes:
            self.at[position] = self.tracker.checkpoint("")


def _check(
    source: str, cp: Checkpoint, chain: ChainReport, capture: _HeadCapture, origin: str | None
) -> CheckpointCheck:
    def failed(problem: str) -> CheckpointCheck:
        return CheckpointCheck(source=source, ok=False, size=cp.size, problem=problem)

    if not chain.ok and chain.first_bad_position is not None and cp.size >= chain.first_bad_position:
        return failed(f"the chain is broken at position {chain.first_bad_position}, within this checkpoint's {cp.size}")
    if cp.size > chain.head_position:
        return failed(
            f"the ledger has {chain.head_position} events, the checkpoint {cp.size}: rows were cut from the end"
        )
    if origin is not None and cp.size > 0 and cp.origin != origin:
        return failed(
            f"the checkpoint is for origin {cp.origin!r}, this ledger is {origin!r} (LEDGER_CHECKPOINT_ORIGIN)"
        )
    seen = capture.at[cp.size]
    if seen.head_hash != cp.head_hash:
        return failed(
            f"the hash at position {cp.size} is {seen.head_hash}, the checkpoint says {cp.head_hash}: "
            "the ledger was rewritten and re-chained"
        )
    if cp.recorded_at_digest is not None and seen.recorded_at_digest != cp.recorded_at_digest:
        return failed(
            f"a recorded_at at or before position {cp.size} differs from the signed one: the column was edited"
        )
    return CheckpointCheck(source=source, ok=True, size=cp.size)
