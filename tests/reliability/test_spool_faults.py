"""Spool faults against the real `ledger serve`: a damaged spool at start, a full disk, replay with no traffic.

- A spool with a damaged record in the middle: the gateway starts anyway, replays the good
  records on both sides of it, quarantines the damaged bytes and says `degraded` until they are moved.
- A spool on a 1 MiB tmpfs that fills up: every write either lands whole or is cut back and
  raised; the file always scans clean (skipped where `mount -t tmpfs` is not permitted; a failure in CI).
- PostgreSQL behind `TcpCut`: calls spooled during a cut reach the database after it returns
  with no further request (the writer replays on its retry timer).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.gateway.relay import RelayedGateway
from tests.ledger.helpers import call_events
from tests.reliability.helpers import chat_body, raw_call, read_ledger, tmpfs, verify_fast
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.errors import SpoolWriteFailed
from usage_ledger.ledger.read import head_position, iter_events
from usage_ledger.ledger.spool import Spool, SpoolRecord

pytestmark = pytest.mark.slow


async def _event_ids(db_url: str) -> list[str]:
    """The ids of the calls' events (the gateway also appends its samples of the upstream, `server.sampled`)."""
    database = open_database(db_url, null_pool=True)
    try:
        return [str(e.event_id) async for e in iter_events(database) if e.stream.startswith("call-")]
    finally:
        await database.dispose()


async def test_serve_starts_on_a_damaged_spool_and_recovers_around_it(
    emulator: Process, backend_url: str, tmp_path: Path
) -> None:
    processes.upgrade(backend_url)
    records = [SpoolRecord(events=call_events(i)) for i in range(3)]
    with Spool(tmp_path / "spool") as spool:
        starts = []
        for record in records:
            starts.append(spool.size_bytes)
            spool.write(record)
    data = bytearray(spool.path.read_bytes())
    data[starts[1] + 40] ^= 0xFF
    spool.path.write_bytes(bytes(data))
    gw = processes.gateway(tmp_path, emulator.url, backend_url)  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)  # before the fix: exit 2, "record at byte N fails its checksum"
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            health = (await http.get(gw.url + "/_ledger/health")).json()  # type: ignore[attr-defined]
            assert health["status"] == "degraded" and "quarantined" in " ".join(health["reasons"]), health
            assert await _event_ids(backend_url) == [
                str(e.event_id) for r in (records[0], records[2]) for e in r.events
            ]
            [side] = spool.quarantined()
            side.rename(tmp_path / side.name)
            assert (await http.get(gw.url + "/_ledger/health")).json()["status"] == "ok"  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(gw.stop)
    log = gw.log_path.read_text()
    assert '"spool_region_quarantined"' in log and f'"offset": {starts[1]}' in log and '"level": "warning"' in log
    print(f"\nSPOOL damaged-at-start: recovered 2 of 3 records, quarantined {starts[2] - starts[1]} B at {starts[1]}")


def test_a_full_disk_never_leaves_a_torn_record(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "1m") as small:
        kept: list[SpoolRecord] = []
        failures = 0
        with Spool(small) as spool:
            for i in range(2000):  # ≈ 700 B per record: the 1 MiB fills on the way
                record = SpoolRecord(events=call_events(i) * 2)
                try:
                    spool.write(record)
                    kept.append(record)
                except SpoolWriteFailed:
                    failures += 1
                    scan = spool.scan()
                    assert scan.torn_tail_at is None and not scan.damaged
                    if failures >= 5:
                        break
            assert failures, "the tmpfs never filled up"
            scan = spool.scan()
            assert [e.event_id for r in scan.records for e in r.events] == [e.event_id for r in kept for e in r.events]
            spool.clear()  # room again (as after a replay): the spool keeps working
            spool.write(SpoolRecord(events=call_events(9999)))
            assert len(spool.scan().records) == 1
    print(f"\nSPOOL full tmpfs: {len(kept)} records kept whole, {failures} writes cut back and raised")


async def test_spool_replays_with_no_traffic_after_an_outage(
    relayed_gateway: RelayedGateway, fresh_pg_url: str
) -> None:
    relay = relayed_gateway.relay
    url: str = relayed_gateway.gateway.url  # type: ignore[attr-defined]
    async with httpx.AsyncClient(timeout=30) as http:
        before = [await raw_call(http, url, chat_body(f"before {i}", max_tokens=4, stream=False)) for i in range(3)]
        await relay.cut()
        during = [
            await raw_call(http, url, chat_body(f"during {i}", max_tokens=4, stream=i % 2 == 0)) for i in range(5)
        ]
        health = (await http.get(url + "/_ledger/health")).json()
        assert health["spooling"] and health["status"] == "degraded", health
        assert any("database unavailable" in r for r in health["reasons"]), health
        await relay.start()
        returned = time.monotonic()
        while time.monotonic() - returned < 10:  # no request but health from here on
            health = (await http.get(url + "/_ledger/health")).json()
            if not health["spooling"]:
                break
            await asyncio.sleep(0.1)
        drained_s = time.monotonic() - returned
        assert not health["spooling"] and health["spool_bytes"] == 0, health
        assert health["status"] == "ok", health
        ledger = await read_ledger(fresh_pg_url)
        ids = [o.call_id for o in before + during]
        assert all(o.complete and o.status == 200 for o in before + during)
        assert set(ids) == set(ledger.finished) == set(ledger.started)
    await verify_fast(fresh_pg_url)
    print(
        f"\nSPOOL replay without traffic: {len(during)} calls spooled, in the database {drained_s:.2f} s after it returned"
    )


async def test_kill_9_in_the_middle_of_a_replay_loses_and_doubles_nothing(
    emulator: Process, backend_url: str, tmp_path: Path
) -> None:
    """A gateway starts on a big spool (left by an outage) and is killed with SIGKILL while it
    replays it; the next start replays the rest: every event once, the chain intact."""
    processes.upgrade(backend_url)
    records = [SpoolRecord(events=call_events(i)) for i in range(4000)]
    with Spool(tmp_path / "spool") as spool:
        for record in records:
            spool.write(record)
    total = sum(len(r.events) for r in records)
    gw = processes.gateway(tmp_path, emulator.url, backend_url)  # type: ignore[attr-defined]
    starting = asyncio.create_task(asyncio.to_thread(gw.start))
    killed_at = 0
    watcher = open_database(backend_url, null_pool=True)  # one engine: a poll is one query, not a connect
    try:
        while not starting.done():  # the replay of 8,000 events takes seconds; look every 5 ms
            async with watcher.engine.connect() as conn:
                appended = await head_position(conn)
            if 0 < appended < total:
                gw.kill()
                killed_at = appended
                break
            await asyncio.sleep(0.005)
    finally:
        await watcher.dispose()
    with contextlib.suppress(RuntimeError):  # "exited -9": killed before it was healthy
        await starting
    gw.kill()  # a kill that missed the replay must not leave this gateway running past the test
    gw.log.close()
    assert 0 < killed_at < total, "the kill did not land during the replay"
    gw = processes.gateway(tmp_path, emulator.url, backend_url)  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            health = (await http.get(gw.url + "/_ledger/health")).json()  # type: ignore[attr-defined]
            assert not health["spooling"] and health["status"] == "ok", health
    finally:
        await asyncio.to_thread(gw.stop)
    ids = await _event_ids(backend_url)
    assert ids == [str(e.event_id) for r in records for e in r.events]  # each once, in spool order
    assert await verify_fast(backend_url) >= total  # and the samples of the upstream
    print(f"\nSPOOL kill -9 mid-replay: killed with {killed_at} of {total} events replayed; 0 lost, 0 doubled")
