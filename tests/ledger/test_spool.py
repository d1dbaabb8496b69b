"""The outage spool: durable while the database is away, replayed in order with no loss or duplicates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledger.append import append_events
from ledger.blobs import blob_hash, read_blob
from ledger.db import Database, open_database
from ledger.errors import ConfigError, SpoolCorrupt
from ledger.read import iter_events
from ledger.spool import Spool, SpoolRecord
from ledger.verify import verify_chain
from ledger.writer import EventWriter, replay_spool
from tests.ledger.helpers import call_events

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nowhere"


async def test_writer_spools_while_the_database_is_down_and_replays_in_order(
    database: Database, tmp_path: Path
) -> None:
    body = b"prompt body " * 500
    digest = blob_hash(body)
    down = open_database(UNREACHABLE, null_pool=True)
    spool = Spool(tmp_path / "spool")
    events = [call_events(i, body_hash=digest) for i in range(30)]
    async with EventWriter(down, spool, retry_interval_s=3600) as writer:
        outcomes = [await writer.append(batch, {digest: body}) for batch in events]
        assert set(outcomes) == {"spooled"} and writer.spooling and writer.spool_bytes > 0
        writer.database = database  # the database is back
        writer.retry_interval_s = 0
        writer._next_retry = 0
        last = call_events(30)
        assert await writer.append(last) == "committed"
    await down.dispose()
    stored = [e async for e in iter_events(database)]
    expected = [e.event_id for batch in [*events, last] for e in batch]
    assert [e.event_id for e in stored] == expected  # spooled first, in order, then the new one
    assert spool.size_bytes == 0
    async with database.engine.connect() as conn:
        assert await read_blob(conn, digest) == body
    assert (await verify_chain(database)).ok


async def test_replaying_twice_adds_nothing(database: Database, tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.write(SpoolRecord(events=call_events(1) + call_events(2)))
        saved = spool.path.read_bytes()
        assert await replay_spool(database, spool) == (4, 0)
        spool.path.write_bytes(saved)  # as if we crashed before clearing the spool
        assert await replay_spool(database, spool) == (0, 4)
    assert (await verify_chain(database)).checked == 4


async def test_a_torn_last_record_is_reported_and_skipped(database: Database, tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.write(SpoolRecord(events=call_events(1)))
        spool.write(SpoolRecord(events=call_events(2)))
        data = spool.path.read_bytes()
        spool.path.write_bytes(data[:-7])  # the crash cut the last write short
        scan = spool.scan()
        assert len(scan.records) == 1 and scan.torn_tail_at is not None
        assert await replay_spool(database, spool) == (2, 0)


async def test_a_corrupt_record_before_the_end_stops_replay(database: Database, tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.write(SpoolRecord(events=call_events(1)))
        spool.write(SpoolRecord(events=call_events(2)))
        data = bytearray(spool.path.read_bytes())
        data[20] ^= 0xFF
        spool.path.write_bytes(bytes(data))
        with pytest.raises(SpoolCorrupt, match="byte 0"):
            await replay_spool(database, spool)
    assert (await verify_chain(database)).checked == 0  # nothing half-applied


def test_one_process_owns_a_spool(tmp_path: Path) -> None:
    with Spool(tmp_path), pytest.raises(ConfigError, match="in use"):
        Spool(tmp_path).open()


def test_a_spool_write_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with Spool(tmp_path) as spool:
        spool.write(SpoolRecord(events=call_events(1)))
    assert synced


async def test_replay_appends_what_append_would(database: Database, tmp_path: Path) -> None:
    already = call_events(0)
    await append_events(database, already)
    with Spool(tmp_path) as spool:
        spool.write(SpoolRecord(events=already + call_events(1)))
        assert await replay_spool(database, spool) == (2, 2)
