"""Database outage under load: proxying continues, the spool grows and drains, nothing lost or doubled.

PostgreSQL: the gateway reaches the server through `TcpCut` (tests/gateway/test_faults.py), a relay
the test cuts (every connection aborted, new ones refused) and restores; the shared cluster is
never stopped. SQLite: the database file and its WAL are made immutable with `chattr +i` (root
ignores file modes, not the immutable flag); writes then fail with "disk I/O error" / "attempt to
write a readonly database" until `chattr -i` (skipped where that is not possible; a failure in CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tests._polling import wait_until
from tests._required import unavailable
from tests.gateway import processes
from tests.gateway.processes import Process
from tests.gateway.relay import RelayedGateway
from tests.reliability.helpers import Outcome, chat_body, raw_call, read_blobs, read_ledger, verify_fast

pytestmark = pytest.mark.slow

WORKERS = 6
OUTAGE_S = 3.0


async def _load(url: str, stop: asyncio.Event, out: list[Outcome]) -> None:
    rng = random.Random(7)
    async with httpx.AsyncClient(timeout=30) as http:

        async def worker(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                body = chat_body(f"outage {w}.{n}", max_tokens=rng.randint(3, 40), stream=n % 2 == 0)
                out.append(await raw_call(http, url, body, {"X-Ledger-Run": "outage", "X-Ledger-Ticker": f"T{w}"}))

        await asyncio.gather(*(worker(w) for w in range(WORKERS)))


async def _health(http: httpx.AsyncClient, url: str) -> dict[str, object]:
    health: dict[str, object] = (await http.get(url + "/_ledger/health")).json()
    return health


async def _outage(
    gw: Process, cut: Callable[[], Awaitable[None]], restore: Callable[[], Awaitable[None]]
) -> dict[str, object]:
    """Run load, cut the database for OUTAGE_S, restore it, wait for the spool to drain; returns figures."""
    url: str = gw.url  # type: ignore[attr-defined]
    outcomes: list[Outcome] = []
    stop = asyncio.Event()
    load = asyncio.create_task(_load(url, stop, outcomes))
    max_spool = 0
    async with httpx.AsyncClient(timeout=10) as http:
        await wait_until(lambda: len(outcomes) >= 2 * WORKERS, what="calls answered before the cut")
        before_cut = len(outcomes)
        await cut()
        loop = asyncio.get_running_loop()
        until = loop.time() + OUTAGE_S
        spooling_seen = False
        while loop.time() < until:
            health = await _health(http, url)
            spooling_seen |= bool(health["spooling"])
            max_spool = max(max_spool, int(health["spool_bytes"]))  # type: ignore[call-overload]
            await asyncio.sleep(0.1)
        during = len(outcomes) - before_cut
        await restore()
        drained_after = None
        start = loop.time()
        for _ in range(200):
            health = await _health(http, url)
            if not health["spooling"] and health["spool_bytes"] == 0:
                drained_after = loop.time() - start
                break
            await asyncio.sleep(0.1)
        drained_at = len(outcomes)  # a little load after the drain
        await wait_until(lambda: len(outcomes) >= drained_at + WORKERS, what="calls answered after the drain")
    stop.set()
    await load
    assert spooling_seen and max_spool > 0, "the outage never reached the writer"
    assert drained_after is not None, "the spool did not drain after the database returned"
    assert during > 0, "proxying stopped during the outage"
    return {"outcomes": outcomes, "during": during, "max_spool": max_spool, "drained_s": drained_after}


async def _check(db_url: str, figures: dict[str, object], label: str) -> None:
    outcomes: list[Outcome] = figures["outcomes"]  # type: ignore[assignment]
    errors = [o for o in outcomes if o.error or o.status != 200 or not o.complete]
    assert errors == [], errors[:3]
    ledger = await read_ledger(db_url)  # raises on any call recorded twice
    assert len(set(ledger.event_ids)) == len(ledger.event_ids)
    ids = [o.call_id for o in outcomes]
    assert len(set(ids)) == len(ids)
    assert set(ids) == set(ledger.started) == set(ledger.finished) and not ledger.failed
    blobs = await read_blobs(db_url, [ledger.finished[o.call_id].response_blob for o in outcomes])  # type: ignore[index,misc]
    assert all(blobs[ledger.finished[o.call_id].response_blob] == o.body for o in outcomes)  # type: ignore[index,index]
    checked = await verify_fast(db_url)
    print(
        f"\nOUTAGE {label}: calls={len(outcomes)} during_outage={figures['during']} "
        f"max_spool_bytes={figures['max_spool']} drained_in_s={figures['drained_s']:.2f} "  # type: ignore[str-format]
        f"events={checked} lost=0 duplicated=0"
    )


async def test_postgresql_outage_under_load(relayed_gateway: RelayedGateway, fresh_pg_url: str) -> None:
    relay = relayed_gateway.relay
    figures = await _outage(relayed_gateway.gateway, relay.cut, relay.start)
    await _check(fresh_pg_url, figures, "postgresql (relay cut)")


def _chattr(flag: str, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chattr", flag, *map(str, files)], capture_output=True, text=True)


@contextlib.asynccontextmanager
async def _immutable_guard(files: list[Path]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await asyncio.to_thread(_chattr, "-i", *files)


async def test_sqlite_read_only_under_load(emulator: Process, tmp_path: Path) -> None:
    db_file = tmp_path / "ledger.db"
    db_url = f"sqlite:///{db_file}"
    processes.upgrade(db_url)
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    attempt = await asyncio.to_thread(_chattr, "+i", probe)
    await asyncio.to_thread(_chattr, "-i", probe)
    if attempt.returncode != 0:
        unavailable(
            f"chattr +i is not possible here ({attempt.stderr.strip()}); needs ext4/xfs and CAP_LINUX_IMMUTABLE"
        )
    gw = processes.gateway(tmp_path, emulator.url, db_url)  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)
    files = [db_file, db_file.with_name("ledger.db-wal")]

    async def cut() -> None:
        result = await asyncio.to_thread(_chattr, "+i", *files)
        assert result.returncode == 0, result.stderr

    async def restore() -> None:
        result = await asyncio.to_thread(_chattr, "-i", *files)
        assert result.returncode == 0, result.stderr

    async with _immutable_guard(files):
        try:
            figures = await _outage(gw, cut, restore)
        finally:
            await asyncio.to_thread(gw.stop)
    await _check(db_url, figures, "sqlite (chattr +i on db and WAL)")
