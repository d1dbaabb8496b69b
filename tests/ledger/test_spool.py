"""The outage spool: durable while the database is away, replayed in order with no loss or duplicates."""

from __future__ import annotations

import errno
import os
import struct
import zlib
from pathlib import Path

import msgspec
import pytest
from structlog.testing import capture_logs

from tests.ledger.helpers import call_events
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import PreparedBlob, blob_hash, read_blob
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.errors import ConfigError, SpoolCorrupt, SpoolWriteFailed
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import UNKEYED, Spool, SpoolRecord
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.ledger.writer import EventWriter, replay_spool

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


async def test_a_corrupt_record_before_the_end_stops_a_strict_replay(database: Database, tmp_path: Path) -> None:
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


def _spool_with(tmp_path: Path, *indexes: int) -> tuple[Spool, list[int], list[SpoolRecord]]:
    """An open spool holding one record per index; returns it, each record's start offset, the records."""
    spool = Spool(tmp_path)
    spool.open()
    starts, records = [], []
    for index in indexes:
        starts.append(spool.size_bytes)
        records.append(SpoolRecord(events=call_events(index)))
        spool.write(records[-1])
    return spool, starts, records


def _ids(*records: SpoolRecord) -> list[str]:
    return [str(e.event_id) for r in records for e in r.events]


def test_a_short_write_loops_until_the_record_is_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    calls: list[int] = []

    def dribble(fd: int, data: bytes) -> int:  # at most 7 bytes per call, as a slow filesystem may
        calls.append(len(data))
        return real_write(fd, bytes(data[:7]))

    spool, _, (first,) = _spool_with(tmp_path, 1)
    second = SpoolRecord(events=call_events(2))
    monkeypatch.setattr(os, "write", dribble)
    spool.write(second)
    monkeypatch.undo()
    assert len(calls) > 2
    assert _ids(*spool.scan().records) == _ids(first, second)
    spool.close()


@pytest.mark.parametrize("failure", ["short-then-enospc", "enospc", "zero", "fsync-eio"])
def test_a_failed_write_is_cut_back_and_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    real_write = os.write
    spool, _, (first,) = _spool_with(tmp_path, 1)
    good = spool.path.read_bytes()
    calls: list[int] = []

    def full_disk(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if failure == "zero":
            return 0
        if failure == "short-then-enospc" and len(calls) == 1:
            return real_write(fd, bytes(data[:13]))  # what fits, then ENOSPC
        raise OSError(errno.ENOSPC, "No space left on device")

    def failing_fsync(fd: int) -> None:
        if not calls:  # the record's fsync fails; the cut-back's fsync works
            calls.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        return None

    if failure == "fsync-eio":
        monkeypatch.setattr(os, "fsync", failing_fsync)
    else:
        monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(SpoolWriteFailed, match="not kept"):
        spool.write(SpoolRecord(events=call_events(2)))
    monkeypatch.undo()
    assert spool.path.read_bytes() == good  # the torn record is gone: the spool ends on a good record
    third = SpoolRecord(events=call_events(3))
    spool.write(third)  # the disk has room again
    scan = spool.scan()
    assert scan.torn_tail_at is None and not scan.damaged
    assert _ids(*scan.records) == _ids(first, third)
    spool.close()


@pytest.mark.parametrize("where", ["length", "crc", "body"])
def test_a_damaged_record_in_the_middle_is_skipped_and_the_rest_read(tmp_path: Path, where: str) -> None:
    spool, starts, (first, _, third) = _spool_with(tmp_path, 1, 2, 3)
    data = bytearray(spool.path.read_bytes())
    at = {"length": starts[1], "crc": starts[1] + 5, "body": starts[1] + 20}[where]
    data[at] ^= 0xFF
    spool.path.write_bytes(bytes(data))
    scan = spool.scan()
    assert _ids(*scan.records) == _ids(first, third)
    assert [(d.offset, d.size) for d in scan.damaged] == [(starts[1], starts[2] - starts[1])]
    assert scan.torn_tail_at is None
    spool.close()


def test_recover_quarantines_the_damage_and_keeps_the_good_records(tmp_path: Path) -> None:
    spool, starts, (first, _, third) = _spool_with(tmp_path, 1, 2, 3)
    data = bytearray(spool.path.read_bytes())
    data[starts[1] + 20] ^= 0xFF
    damaged = bytes(data[starts[1] : starts[2]])
    spool.path.write_bytes(bytes(data) + b"\x00\x00\x10")  # plus a torn tail
    scan = spool.recover()
    assert len(scan.damaged) == 1 and scan.torn_tail_at is not None
    [side] = spool.quarantined()
    assert side.name.startswith("events.spool.quarantine-") and side.name.endswith(f"-{starts[1]}")
    assert side.read_bytes() == damaged  # the damaged bytes, as found
    after = spool.scan()
    assert not after.damaged and after.torn_tail_at is None
    assert _ids(*after.records) == _ids(first, third)
    spool.write(SpoolRecord(events=call_events(4)))  # the new file is the one written to, and it is still ours
    assert len(spool.scan().records) == 3
    with pytest.raises(ConfigError, match="in use"):
        Spool(tmp_path).open()
    spool.close()


async def test_a_quarantining_replay_recovers_what_follows_the_damage(database: Database, tmp_path: Path) -> None:
    spool, starts, (first, _, third) = _spool_with(tmp_path, 1, 2, 3)
    data = bytearray(spool.path.read_bytes())
    data[starts[1] + 2] ^= 0xFF  # the middle record's length
    spool.path.write_bytes(bytes(data))
    assert await replay_spool(database, spool, quarantine=True) == (4, 0)
    stored = [str(e.event_id) async for e in iter_events(database)]
    assert stored == _ids(first, third)
    assert len(spool.quarantined()) == 1 and spool.size_bytes == 0
    spool.close()
    assert (await verify_chain(database)).ok


def _record_bytes(record: SpoolRecord) -> bytes:
    body = msgspec.msgpack.encode(record)
    return struct.pack(">II", len(body), zlib.crc32(body)) + body


@pytest.mark.parametrize("damage", ["body", "torn"])
def test_a_record_quoted_inside_a_damaged_body_is_never_replayed(tmp_path: Path, damage: str) -> None:
    forged = _record_bytes(SpoolRecord(events=call_events(666)))
    carrier = SpoolRecord(
        events=call_events(1), blobs=[PreparedBlob(blob_hash(forged), len(forged), "raw", forged + os.urandom(64))]
    )
    spool, _, (before,) = _spool_with(tmp_path, 0)
    start = spool.size_bytes
    spool.write(carrier)
    if damage == "body":
        spool.write(SpoolRecord(events=call_events(2)))
    data = bytearray(spool.path.read_bytes())
    if damage == "body":
        data[start + 12] ^= 0xFF  # the carrier's checksum fails; a good record follows it
    else:
        del data[-10:]  # the carrier was cut short by a crash
    spool.path.write_bytes(bytes(data))
    scan = spool.scan()
    forged_ids = set(_ids(msgspec.msgpack.decode(forged[8:], type=SpoolRecord)))
    assert not forged_ids & set(_ids(*scan.records))
    assert _ids(*scan.records)[:2] == _ids(before)
    if damage == "body":
        assert len(scan.records) == 2 and [d.offset for d in scan.damaged] == [start]
    else:
        assert len(scan.records) == 1 and [(d.offset, d.size) for d in scan.damaged] == [(start, len(data) - start)]
    spool.close()


# -- trust: planted files, forged records, a spool from another ledger (red team, round three) --------------

NOBODY = 65534


def _legacy_record(record: SpoolRecord) -> bytes:
    """A record as gateways wrote them before spool records were keyed: the msgpack body alone."""
    body = msgspec.msgpack.encode(record)
    return struct.pack(">II", len(body), zlib.crc32(body)) + body


def test_a_spool_file_another_user_planted_is_refused_and_never_read(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    planted = directory / Spool.FILE_NAME
    planted.write_bytes(_legacy_record(SpoolRecord(events=call_events(1))))
    os.chown(planted, NOBODY, NOBODY)
    planted.chmod(0o644)
    with pytest.raises(ConfigError, match=f"spool file {planted} is owned by uid {NOBODY}"):
        Spool(directory).open()


@pytest.mark.parametrize("target", ["directory", "file", "key"])
def test_spool_state_others_may_write_is_refused(tmp_path: Path, target: str) -> None:
    spool = Spool(tmp_path / "spool")
    with spool:
        spool.write(SpoolRecord(events=call_events(1)))
    path = {"directory": spool.directory, "file": spool.path, "key": spool.key_path}[target]
    path.chmod(0o777 if target == "directory" else 0o666)
    with pytest.raises(ConfigError, match="may be written by other users"):
        Spool(tmp_path / "spool").open()
    path.chmod(0o700 if target == "directory" else 0o600)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"is owned by uid {NOBODY}"):
        Spool(tmp_path / "spool").open()


def test_a_sticky_shared_directory_may_hold_a_spool(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others cannot replace what is ours
    with Spool(shared) as spool:
        spool.write(SpoolRecord(events=call_events(1)))
        assert len(spool.scan().records) == 1


async def test_a_forged_record_and_a_spool_from_another_ledger_are_quarantined_never_appended(
    database: Database, tmp_path: Path
) -> None:
    ours, theirs = Spool(tmp_path / "ours" / "spool"), Spool(tmp_path / "theirs" / "spool")
    with theirs:
        theirs.write(SpoolRecord(events=call_events(7)))  # keyed with the other ledger's key
    foreign = theirs.path.read_bytes()
    with ours:
        ours.write(SpoolRecord(events=call_events(1)))
        with ours.path.open("ab") as handle:
            handle.write(foreign)  # a record from elsewhere, or forged without our key
        ours.write(SpoolRecord(events=call_events(2)))
        scan = ours.scan()
        assert [r.events[0].stream for r in scan.records] == [call_events(1)[0].stream, call_events(2)[0].stream]
        assert len(scan.damaged) == 1 and "not keyed by this spool's key" in scan.damaged[0].reason
        with pytest.raises(SpoolCorrupt, match="not keyed by this spool's key"):
            await replay_spool(database, ours)
        appended, _ = await replay_spool(database, ours, quarantine=True)
        assert ours.quarantined()[0].read_bytes() == foreign
    streams = {e.stream async for e in iter_events(database)}
    assert streams == {call_events(1)[0].stream, call_events(2)[0].stream} and appended == 4
    # the other ledger's whole spool directory brought here: nothing of it is taken
    (tmp_path / "moved").mkdir()
    os.rename(theirs.directory, tmp_path / "moved" / "spool")
    with Spool(tmp_path / "moved" / "spool") as moved:  # a fresh key beside it, not theirs
        assert moved.scan().records == [] and len(moved.scan().damaged) == 1


async def test_unkeyed_records_are_replayed_only_when_asked_by_name(database: Database, tmp_path: Path) -> None:
    """A record in the old unkeyed format may be forged by anyone who can write the spool, without the key:
    `ledger spool replay` refuses it (exit 2, the file as it was), `--accept-unkeyed` replays it once, said."""
    directory = tmp_path / "spool"
    directory.mkdir()
    unkeyed = b"".join(_legacy_record(SpoolRecord(events=call_events(i))) for i in range(3))
    (directory / Spool.FILE_NAME).write_bytes(unkeyed)
    with Spool(directory) as spool:
        scan = spool.scan()
        assert scan.records == [] and [d.reason for d in scan.damaged] == [UNKEYED] * 3
        with pytest.raises(SpoolCorrupt, match="--accept-unkeyed"):
            await replay_spool(database, spool)
        assert spool.path.read_bytes() == unkeyed
        assert [e async for e in iter_events(database)] == []
        assert spool.scan(accept_unkeyed=True).unkeyed == 3
        with capture_logs() as logs:
            appended, _ = await replay_spool(database, spool, accept_unkeyed=True)
        assert appended == 6 and spool.scan().records == [] and spool.size_bytes == 0
    assert [e for e in logs if e["event"] == "spool_unkeyed_records_replayed"] == [
        {"event": "spool_unkeyed_records_replayed", "log_level": "warning", "path": str(spool.path), "records": 3}
        | {"detail": logs[0]["detail"]}
    ]
    assert len({e.stream async for e in iter_events(database)}) == 3


async def test_a_gateway_start_quarantines_unkeyed_records_and_replays_the_keyed(
    database: Database, tmp_path: Path
) -> None:
    directory = tmp_path / "spool"
    forged = _legacy_record(SpoolRecord(events=call_events(666)))  # without the key
    with Spool(directory) as spool:
        spool.write(SpoolRecord(events=call_events(1)))
        with spool.path.open("ab") as handle:
            handle.write(forged)
        spool.write(SpoolRecord(events=call_events(2)))
    restarted = Spool(directory)
    async with EventWriter(database, restarted) as writer:
        assert not writer.spooling
        (side,) = restarted.quarantined()
    assert side.read_bytes() == forged
    streams = {e.stream async for e in iter_events(database)}
    assert streams == {call_events(1)[0].stream, call_events(2)[0].stream}
    # the operator's way back for records an older gateway wrote: the side file, replayed by name
    replayed = tmp_path / "unkeyed" / "spool"
    replayed.mkdir(parents=True)
    os.rename(side, replayed / Spool.FILE_NAME)
    with Spool(replayed) as spool:
        assert await replay_spool(database, spool, accept_unkeyed=True) == (2, 0)
