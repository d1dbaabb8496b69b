"""One of two gateways on one PostgreSQL frozen while it holds the chain's head (issue #52, 4).

Two real `ledger serve` processes share a database; A is under load and is stopped (SIGSTOP) at a moment
`pg_locks` shows its append connection idle in a transaction holding `ledger_head` (the window between the
`SELECT … FOR UPDATE` and the INSERT: tried until caught). Then, while A stays stopped: a call on B is answered
(its append gives up after `LEDGER_PG_LOCK_TIMEOUT_S` and spools), B's health says `degraded` meanwhile, the
server ends A's transaction (`LEDGER_PG_IDLE_IN_TRANSACTION_TIMEOUT_S`), B's spool replays and B is `ok` again.
After SIGCONT, A's append finds its connection gone, spools and replays; every call is in the ledger once.

Before: B's call waited as long as A was stopped (20.02 s in the issue; here, for ever), its health said `ok`.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest

from tests._polling import wait_until
from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import Outcome, chat_body, raw_call, read_ledger, verify_fast

pytestmark = pytest.mark.slow

WORKERS = 6
_HOLDER = """
SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = 'ledger_head'::regclass AND l.granted AND l.mode = 'RowShareLock'
    AND a.state = 'idle in transaction' AND a.client_port = ANY($1::int[])
"""
"""A backend of one of the ports' connections, holding the head (`FOR UPDATE`) between two statements."""


def _local_ports(pid: int) -> list[int]:
    """The local TCP ports of process `pid`'s sockets (its connections to PostgreSQL among them), from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def _load(url: str, name: str, stop: asyncio.Event, out: list[Outcome]) -> None:
    async with httpx.AsyncClient(timeout=120) as http:

        async def worker(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                body = chat_body(f"{name} {w}.{n}", max_tokens=3, stream=n % 2 == 0)
                out.append(await raw_call(http, url, body, {"X-Ledger-Run": name}))

        await asyncio.gather(*(worker(w) for w in range(WORKERS)))


async def _health(url: str) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=10) as http:
        health: dict[str, object] = (await http.get(url + "/_ledger/health")).json()
    return health


async def _freeze_holding_the_head(gw: Process, pg: asyncpg.Connection) -> int:
    """SIGSTOP `gw` at a moment its append connection holds the head; returns that connection's backend pid."""
    assert gw.proc is not None
    pid = gw.proc.pid
    rng = random.Random(52)
    for _ in range(2000):
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(0.02)  # what it sent before the stop reaches the server
        holders = await pg.fetch(_HOLDER, _local_ports(pid))
        if holders:
            return int(holders[0]["pid"])
        os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(rng.uniform(0.0, 0.01))
    raise AssertionError("gateway A was never caught holding the head in 2000 tries")


async def test_a_frozen_gateway_does_not_stall_its_peer(emulator: Process, fresh_pg_url: str, tmp_path: Path) -> None:
    processes.upgrade(fresh_pg_url)
    upstream: str = emulator.url  # type: ignore[attr-defined]
    a = processes.gateway(tmp_path / "a", upstream, fresh_pg_url)
    b = processes.gateway(tmp_path / "b", upstream, fresh_pg_url)
    for directory in (tmp_path / "a", tmp_path / "b"):
        directory.mkdir()
    await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.start))
    a_url, b_url = a.url, b.url  # type: ignore[attr-defined]
    pg = await asyncpg.connect(fresh_pg_url)
    outcomes: list[Outcome] = []
    on_b: list[Outcome] = []
    stop = asyncio.Event()
    load = asyncio.create_task(_load(a_url, "frozen-peer-a", stop, outcomes))
    stopped = False
    try:
        await wait_until(lambda: len(outcomes) >= 2 * WORKERS, timeout_s=60, what="calls answered by A")
        holder = await _freeze_holding_the_head(a, pg)
        stopped = True

        # while A stays stopped: B answers, says degraded meanwhile, and A's transaction is ended by the server
        healths: list[dict[str, object]] = []
        answered = asyncio.Event()

        async def watch_b() -> None:
            while not answered.is_set():
                healths.append(await _health(b_url))
                await asyncio.sleep(0.05)

        watching = asyncio.create_task(watch_b())
        async with httpx.AsyncClient(timeout=120) as http:
            body = chat_body("frozen-peer-b", max_tokens=3, stream=False)
            call = asyncio.create_task(raw_call(http, b_url, body, {"X-Ledger-Run": "frozen-peer-b"}))
            done, _ = await asyncio.wait([call], timeout=60)
            answered.set()
            await watching
            assert done, "B's call waited on A's head lock (A is still stopped)"
            on_b.append(call.result())
        assert on_b[0].status == 200 and on_b[0].complete, on_b[0]
        assert any(h["status"] == "degraded" for h in healths), healths
        assert any("stayed locked" in str(h["reasons"]) or "has waited" in str(h["reasons"]) for h in healths)

        async def ended() -> bool:
            return not await pg.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", holder)

        await wait_until(ended, timeout_s=30, what="the server to end stopped A's transaction")

        async def b_ok() -> bool:
            health = await _health(b_url)
            return health["status"] == "ok" and not health["spooling"]

        await wait_until(b_ok, timeout_s=30, every_s=0.1, what="B's spool replayed while A is still stopped")
        assert a.proc is not None and a.proc.poll() is None
        async with httpx.AsyncClient(timeout=60) as http:
            body = chat_body("frozen-peer-b after", max_tokens=3, stream=True)
            on_b.append(await raw_call(http, b_url, body, {"X-Ledger-Run": "frozen-peer-b"}))

        os.kill(a.proc.pid, signal.SIGCONT)
        stopped = False
        answered_by_a = len(outcomes)
        await wait_until(lambda: len(outcomes) >= answered_by_a + 2 * WORKERS, timeout_s=60, what="A answers again")

        async def a_ok() -> bool:
            health = await _health(a_url)
            return health["status"] == "ok" and not health["spooling"]

        await wait_until(a_ok, timeout_s=30, every_s=0.1, what="A's spool replayed after it woke")
    finally:
        if stopped and a.proc is not None:
            os.kill(a.proc.pid, signal.SIGCONT)
        stop.set()
        await load
        await pg.close()
        await asyncio.gather(asyncio.to_thread(a.stop), asyncio.to_thread(b.stop))
    everything = outcomes + on_b
    errors = [o for o in everything if o.error or o.status != 200 or not o.complete]
    assert errors == [], errors[:3]
    ledger = await read_ledger(fresh_pg_url)  # raises on any call recorded twice
    assert len(set(ledger.event_ids)) == len(ledger.event_ids)
    ids = [o.call_id for o in everything]
    assert len(set(ids)) == len(ids)
    assert set(ids) == set(ledger.started) == set(ledger.finished) and not ledger.failed
    checked = await verify_fast(fresh_pg_url)
    print(f"\nFROZEN PEER: calls={len(everything)} events={checked} lost=0 duplicated=0")
