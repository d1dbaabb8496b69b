"""The writer around the spool: replay on a timer, recovery at start, failed spool writes, health."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from tests._polling import wait_until
from tests.ledger.helpers import call_events
from usage_ledger.gateway.admin import create_admin_app
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.errors import SpoolWriteFailed
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool, SpoolRecord
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.ledger.writer import EventWriter

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nowhere"


async def _stored_ids(database: Database) -> list[str]:
    return [str(e.event_id) async for e in iter_events(database)]


async def _health(writer: EventWriter, database: Database) -> dict[str, object]:
    app = create_admin_app(GatewaySettings(), database=database, writer=writer, metrics=Metrics())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
        response = await client.get("/_ledger/health")
    body: dict[str, object] = response.json()
    assert response.status_code == (200 if body["status"] == "ok" else 503), body  # a health check sees trouble
    return body


async def test_the_spool_is_replayed_on_a_timer_without_traffic(database: Database, tmp_path: Path) -> None:
    down = open_database(UNREACHABLE, null_pool=True)
    spool = Spool(tmp_path / "spool")
    batches = [call_events(i) for i in range(5)]
    async with EventWriter(down, spool, retry_interval_s=0.5) as writer:
        assert {await writer.append(batch) for batch in batches} == {"spooled"}
        health = await _health(writer, database)
        assert health["status"] == "degraded" and health["spooling"]
        assert "spool cannot be replayed yet: database unavailable" in str(health["reasons"])
        writer.database = database  # the database is back; nothing more is sent
        await wait_until(lambda: not writer.spooling, timeout_s=5, what="the spool replayed without traffic")
        assert await _stored_ids(database) == [str(e.event_id) for b in batches for e in b]
        assert spool.size_bytes == 0
        assert (await _health(writer, database))["status"] == "ok"
    await down.dispose()
    assert (await verify_chain(database)).ok


async def test_the_outage_is_logged_at_warning_once_and_retried_on_the_timer(
    database: Database, tmp_path: Path
) -> None:
    down = open_database(UNREACHABLE, null_pool=True)
    with capture_logs() as logs:
        async with EventWriter(down, Spool(tmp_path / "spool"), retry_interval_s=0.05) as writer:
            await writer.append(call_events(1))
            await wait_until(  # several timer retries
                lambda: sum(e["event"] == "spool_replay_deferred" for e in logs) >= 3, what="three retries"
            )
            writer.database = database
    await down.dispose()
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["ledger_unavailable_spooling"]  # the reason, once
    retries = [e for e in logs if e["event"] == "spool_replay_deferred"]
    assert len(retries) >= 3 and {e["log_level"] for e in retries} == {"debug"}  # the timer kept trying
    assert len(await _stored_ids(database)) == 2  # close() replayed it


async def test_start_quarantines_damage_and_replays_what_is_around_it(database: Database, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    records = [SpoolRecord(events=call_events(i)) for i in range(3)]
    with spool:
        starts = []
        for record in records:
            starts.append(spool.size_bytes)
            spool.write(record)
    data = bytearray(spool.path.read_bytes())
    data[starts[1] + 30] ^= 0xFF  # the middle record's body: its checksum fails
    spool.path.write_bytes(bytes(data))
    with capture_logs() as logs:
        async with EventWriter(database, spool) as writer:
            assert await _stored_ids(database) == [str(e.event_id) for r in (records[0], records[2]) for e in r.events]
            health = await _health(writer, database)
            assert health["status"] == "degraded" and not health["spooling"]
            assert "quarantined" in str(health["reasons"])
            [side] = spool.quarantined()
            side.rename(tmp_path / side.name)  # looked at and moved away
            assert (await _health(writer, database))["status"] == "ok"
    [warning] = [e for e in logs if e["event"] == "spool_region_quarantined"]
    assert warning["log_level"] == "warning"
    assert (warning["offset"], warning["bytes"]) == (starts[1], starts[2] - starts[1])
    assert (await verify_chain(database)).ok


async def test_a_failed_spool_write_fails_the_append(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = open_database(UNREACHABLE, null_pool=True)
    spool = Spool(tmp_path / "spool")
    async with EventWriter(down, spool, retry_interval_s=3600) as writer:
        first = call_events(1)
        assert await writer.append(first) == "spooled"
        real_write = os.write

        def full_disk(fd: int, data: bytes) -> int:
            if fd == spool._fd:
                real_write(fd, bytes(data[:10]))
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", full_disk)
        with pytest.raises(SpoolWriteFailed):
            await writer.append(call_events(2))  # not durable, and the caller is told
        monkeypatch.undo()
        third = call_events(3)
        assert await writer.append(third) == "spooled"
        writer.database = database
    await down.dispose()
    assert await _stored_ids(database) == [str(e.event_id) for e in first + third]


async def test_health_says_so_when_events_can_be_neither_committed_nor_spooled(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team, round three: with the database and the spool on a full disk, health said `ok`."""
    down = open_database(UNREACHABLE, null_pool=True)
    spool = Spool(tmp_path / "spool")
    async with EventWriter(down, spool, retry_interval_s=3600) as writer:

        def full(_record: SpoolRecord) -> None:
            raise SpoolWriteFailed("spool: write failed (No space left on device); the record was not kept")

        monkeypatch.setattr(spool, "write", full)
        with pytest.raises(SpoolWriteFailed):
            await writer.append(call_events(1))
        health = await _health(writer, database)
        assert health["status"] == "degraded"
        assert any(
            str(r).startswith("events cannot be recorded:") and "No space left" in str(r) for r in health["reasons"]
        )
        monkeypatch.undo()
        assert await writer.append(call_events(2)) == "spooled"  # recorded again: that reason goes
        assert not any("cannot be recorded" in str(r) for r in (await _health(writer, database))["reasons"])
    await down.dispose()


async def test_health_says_so_when_the_disk_is_nearly_full(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.statvfs

    def nearly_full(path: str) -> os.statvfs_result:
        found = real(path)
        values = list(found)
        values[4] = 10  # f_bavail: 10 blocks
        return os.statvfs_result(values)

    async with EventWriter(database, Spool(tmp_path / "spool")) as writer:
        assert (await _health(writer, database))["status"] == "ok"
        monkeypatch.setattr(os, "statvfs", nearly_full)
        reasons = (await _health(writer, database))["reasons"]
        assert any(str(r).startswith(f"spool {tmp_path / 'spool'}:") and "MiB free" in str(r) for r in reasons), reasons


async def test_health_recovers_on_its_own_once_a_full_disk_is_freed(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#52 point 9: after a full disk was freed, health said `degraded` until some call arrived."""
    down = open_database(UNREACHABLE, null_pool=True)
    spool = Spool(tmp_path / "spool")
    real_write = os.write
    full = True

    def disk(fd: int, data: bytes) -> int:  # every write under the spool directory, the writer's and any probe's
        if full and os.readlink(f"/proc/self/fd/{fd}").startswith(str(spool.directory)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    async with EventWriter(down, spool, retry_interval_s=0.02) as writer:
        monkeypatch.setattr(os, "write", disk)
        with pytest.raises(SpoolWriteFailed):
            await writer.append(call_events(1))

        async def cannot_record() -> bool:
            return any("cannot be recorded" in str(r) for r in (await _health(writer, database))["reasons"])

        assert await cannot_record()
        for _ in range(5):  # several re-checks while the disk is still full: still so
            await wait_until(lambda: writer.queue_depth == 0)
            assert await cannot_record()
        full = False  # freed; no call arrives
        await wait_until(lambda: not any("cannot be recorded" in p for p in writer.problems), what="recovery")
        assert not await cannot_record()
        monkeypatch.undo()
        assert await writer.append(call_events(2)) == "spooled"  # as health now says: recorded
    await down.dispose()
