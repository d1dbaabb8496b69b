"""Crash: `kill -9` of the gateway at random moments during 14 concurrent streams, repeated.

After every restart: each response a client received in full is in the ledger as `call.finished`
with the exact bytes the client got; every call cut by the crash is started-not-finished (or, if
it reached the upstream's end before the kill, finished); `ledger report runs` counts the cut ones
in `incomplete_calls`; the hash chain verifies.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import Outcome, chat_body, raw_call, read_blobs, read_ledger, runs_report, verify_fast

pytestmark = pytest.mark.slow

ROUNDS = 3
WORKERS = 14
RUN = "crash"


async def _worker(http: httpx.AsyncClient, url: str, worker: int, rng: random.Random, out: list[Outcome]) -> None:
    n = 0
    while True:
        n += 1
        body = chat_body(f"ticker {worker} call {n}", max_tokens=rng.randint(5, 300), stream=True)
        outcome = await raw_call(http, url, body, {"X-Ledger-Run": RUN, "X-Ledger-Ticker": f"T{worker:02d}"})
        out.append(outcome)
        if outcome.error is not None:
            return  # the gateway is gone


async def test_kill_9_at_random_moments(emulator: Process, backend_url: str, tmp_path: Path) -> None:
    processes.upgrade(backend_url)
    rng = random.Random(20240917)
    outcomes: list[Outcome] = []
    kills: list[float] = []
    port = processes.free_port()
    for _ in range(ROUNDS):
        gw = processes.gateway(tmp_path, emulator.url, backend_url, port=port)  # type: ignore[attr-defined]
        await asyncio.to_thread(gw.start)
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=WORKERS)) as http:
            tasks = [
                asyncio.create_task(_worker(http, gw.url, i, random.Random(rng.random()), outcomes))  # type: ignore[attr-defined]
                for i in range(WORKERS)
            ]
            moment = rng.uniform(0.3, 2.5)
            kills.append(moment)
            await asyncio.sleep(moment)
            await asyncio.to_thread(gw.kill)  # SIGKILL: no shutdown, no flush
            await asyncio.gather(*tasks)
        gw.log.close()
        await verify_fast(backend_url)  # the chain is intact after every crash

    # restart once more and shut down cleanly: the spool (if any) is replayed, nothing is in flight
    gw = processes.gateway(tmp_path, emulator.url, backend_url, port=port)  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)
    await asyncio.to_thread(gw.stop)

    ledger = await read_ledger(backend_url)
    complete = [o for o in outcomes if o.complete and o.status == 200]
    cut = [o for o in outcomes if not o.complete]
    assert len(cut) >= ROUNDS * WORKERS and len(complete) > 0
    # every response received in full is finished in the ledger, with exactly the bytes the client got
    assert {o.call_id for o in complete} <= set(ledger.finished)
    blobs = await read_blobs(backend_url, [ledger.finished[o.call_id].response_blob for o in complete])  # type: ignore[index,misc]
    for o in complete:
        assert blobs[ledger.finished[o.call_id].response_blob] == o.body  # type: ignore[index,index]
    # what the ledger holds unfinished was cut on the client side too
    # (a call cut before its response headers left the gateway has no id on the client side)
    cut_ids = {o.call_id for o in cut if o.call_id}
    assert len(ledger.incomplete - cut_ids) <= len([o for o in cut if o.call_id is None])
    assert not ledger.failed
    lost = [o.call_id for o in cut if o.call_id and o.call_id not in ledger.started]
    assert lost == [], f"{len(lost)} calls whose headers reached the client are not in the ledger"
    [row] = await runs_report(backend_url, RUN)
    assert row["incomplete_calls"] == len(ledger.incomplete) > 0
    assert row["calls"] == len(ledger.started)
    await verify_fast(backend_url)
    print(
        f"\nCRASH {backend_url.split(':')[0]}: rounds={ROUNDS} kills_at_s={[round(k, 2) for k in kills]} "
        f"calls={len(outcomes)} complete={len(complete)} cut={len(cut)} cut_with_headers={len(cut_ids)} "
        f"ledger_started={len(ledger.started)} finished={len(ledger.finished)} incomplete={len(ledger.incomplete)} "
        f"lost={len(lost)}"
    )
