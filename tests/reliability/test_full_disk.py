"""A full disk under load, against the real `ledger serve`, with strict durability (the default).

The database (SQLite) lives on a 32 MiB tmpfs that `dd` fills while eight clients keep calling:
- spool on the same disk (the default layout: `./ledger.db` and `./ledger-spool`): once neither the
  database nor the spool can take a call's final event, the call is not completed to its client —
  the gateway drops the connection before the last bytes, so the client sees an error — and every
  response that did arrive complete is in the ledger once the disk has room again;
- spool on another disk: the calls go on completing, spooled, and reach the database afterwards.
Before the fix, 75 of 202 complete 200 responses were recorded nowhere.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests._polling import wait_until
from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import Outcome, chat_body, raw_call, read_ledger, tmpfs, verify_fast

pytestmark = pytest.mark.slow

CLIENTS = 8
FULL_CALLS = 200  # made while the disk is full


async def _load(url: str, stop: asyncio.Event, outcomes: list[Outcome]) -> None:
    async def client(n: int) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            i = 0
            while not stop.is_set():
                body = chat_body(f"client {n} call {i} " + "x" * 2000, max_tokens=8, stream=i % 2 == 0)
                outcomes.append(await raw_call(http, url, body))
                i += 1

    await asyncio.gather(*(client(n) for n in range(CLIENTS)))


async def _wait_until_drained(url: str, seconds: float) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=10) as http:
        deadline = time.monotonic() + seconds
        while True:
            health: dict[str, object] = (await http.get(url + "/_ledger/health")).json()
            if not health["spooling"] or time.monotonic() > deadline:
                return health
            await asyncio.sleep(0.2)


def _refused(outcome: Outcome) -> bool:
    """Cut before the last bytes, or a 503 `ledger_unavailable` when even the start was durable nowhere."""
    return outcome.error is not None or not outcome.complete or outcome.status == 503


def _sizes(*directories: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for d in directories for p in d.iterdir()}


@pytest.mark.parametrize("spool_on", ["the same disk", "another disk"])
async def test_a_full_disk_never_completes_an_unrecorded_call(emulator: Process, tmp_path: Path, spool_on: str) -> None:
    with tmpfs(tmp_path / "disk", "32m") as disk:
        db_url = f"sqlite:///{disk / 'ledger.db'}"
        processes.upgrade(db_url)
        spool = disk / "spool" if spool_on == "the same disk" else tmp_path / "spool"
        gw = processes.gateway(tmp_path, emulator.url, db_url, "--spool-dir", str(spool))
        await asyncio.to_thread(gw.start)
        url: str = gw.url  # type: ignore[attr-defined]
        outcomes: list[Outcome] = []
        stop = asyncio.Event()
        try:
            load = asyncio.create_task(_load(url, stop, outcomes))
            await wait_until(lambda: len(outcomes) >= 2 * CLIENTS, what="calls answered before the disk fills")
            before_full = len(outcomes)
            filler = disk / "filler"
            dd = ["dd", "if=/dev/zero", f"of={filler}", "bs=64k"]  # until ENOSPC
            await asyncio.to_thread(subprocess.run, dd, capture_output=True, check=False)
            full_at = len(outcomes)

            def full_long_enough() -> bool:
                made = outcomes[full_at:]
                # enough calls to catch one completed unrecorded (the disk was full 4 s before, ≈ 900 calls on a quiet
                # box); spool on the same disk, until a call was refused too: the database and the spool both full
                return len(made) >= FULL_CALLS and (spool_on == "another disk" or any(map(_refused, made)))

            await wait_until(full_long_enough, what="calls made while the disk was full")
            while_full = len(outcomes) - full_at
            filler.unlink()  # room again: the writer's timer replays what it could spool
            room_at = len(outcomes)
            await wait_until(lambda: len(outcomes) >= room_at + CLIENTS, what="calls made with room again")
            stop.set()
            await load
            health = await _wait_until_drained(url, 20)
            assert not health["spooling"], (health, _sizes(disk, spool))  # with what filled the disk
        finally:
            stop.set()
            await asyncio.to_thread(gw.stop)
        ledger = await read_ledger(db_url)
        await verify_fast(db_url)

    complete = [o for o in outcomes if o.status == 200 and o.complete and o.error is None]
    refused = [o for o in outcomes if _refused(o)]
    unrecorded = [o.call_id for o in complete if o.call_id not in ledger.finished]
    assert before_full > 0 and while_full > 0, (before_full, while_full)
    assert unrecorded == []  # before the fix: 75 of 202 here
    if spool_on == "another disk":
        assert refused == [], [o.error for o in refused][:3]  # spooled, then replayed
    else:
        assert refused, "the disk never filled up for both the database and the spool"
        log = gw.log_path.read_text()
        assert '"call_record_failed"' in log
    print(
        f"\nFULL DISK (spool on {spool_on}): {len(outcomes)} calls, {len(complete)} complete (all recorded), "
        f"{len(refused)} dropped before their last bytes, {while_full} made while the disk was full"
    )
