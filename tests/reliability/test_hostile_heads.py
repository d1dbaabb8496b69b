"""Header lines that never end, from a client and from the upstream, against the real `ledger serve`.

Issue #52, point 2: the 64 KiB head cap was counted only when httptools handed over a complete header,
and httptools buffers an unfinished one, copying it again at each read. Six client connections each
sending one endless header value froze the event loop for about 30 s (a normal call took 33.6 s here:
38.6 s) and took the gateway from 115 to 652 MiB (here 114 → 499); an upstream's 100 MB header line
was relayed after a minute, peaking at 1,186 MiB while other calls waited 13 s (here 28.6 s, 305 MiB).
Now the bytes of an unfinished head are counted as they arrive: a client's is answered 431 at the cap,
an upstream's is a 502 (`upstream_reset`) and its connection is closed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import Outcome, chat_body, raw_call, read_ledger
from tests.reliability.slow_clients import header_bomb

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # bytes as fast as the box moves them: alone on the box

MIB = 1024 * 1024
BOMBERS = 6
UPSTREAM_BOMBS = 2
UPSTREAM_LINE = 100_000_000
ATTACK_S = 10.0
SERVED_WITHIN_S = 5.0
"""Generous on a shared 2-core box: a correctness bound (not starved), not a performance claim."""
GROWTH = 64 * MIB
"""What the gateway's peak RSS may grow by during an attack: buffers and the allocator's slack (it grew by GBs)."""


def _rss(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS


async def _gateway(tmp_path: Path, upstream: str) -> Process:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db_url)
    gw = processes.gateway(tmp_path, upstream, db_url)
    gw.db_url = db_url  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)
    return gw


async def _calls_until(
    url: str, stop: asyncio.Future[Any] | float, headers: dict[str, str] | None = None
) -> list[tuple[Outcome, float]]:
    """Normal calls one after another (a new connection each) until loop time `stop`, or until `stop` is done."""
    loop = asyncio.get_running_loop()
    made: list[tuple[Outcome, float]] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        while (loop.time() < stop) if isinstance(stop, float) else not stop.done():
            began = loop.time()
            call = await raw_call(http, url, chat_body("normal", max_tokens=2, stream=False), headers=headers)
            made.append((call, loop.time() - began))
            await asyncio.sleep(0.3)
    return made


async def _bomber(port: int, until: float) -> Counter[str]:
    """Endless header lines, one connection after another, until loop time `until`."""
    loop = asyncio.get_running_loop()
    outcomes: Counter[str] = Counter()
    while loop.time() < until:
        outcomes[await header_bomb(port, give_up_s=45)] += 1
    return outcomes


async def test_client_header_lines_that_never_end_get_431_and_hold_no_call_up(
    emulator: Process, tmp_path: Path
) -> None:
    gw = await _gateway(tmp_path, emulator.url)  # type: ignore[attr-defined]
    pid = gw.proc.pid  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            await raw_call(http, gw.url, chat_body("warm", max_tokens=2, stream=False))  # type: ignore[attr-defined]
        idle = _rss(pid, "VmRSS")
        _reset_peak(pid)
        until = loop.time() + ATTACK_S
        bombers = asyncio.gather(*(_bomber(gw.port, until) for _ in range(BOMBERS)))  # type: ignore[attr-defined]
        calls = await _calls_until(gw.url, until)  # type: ignore[attr-defined]
        outcomes: Counter[str] = sum(await bombers, Counter())
        peak = _rss(pid, "VmHWM")
    finally:
        gw.stop()
    slowest = max(took for _, took in calls)
    print(
        f"\nHEAD BOMBS {dict(outcomes)}; {len(calls)} calls meanwhile, slowest {slowest:.2f} s; "
        f"RSS idle {idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB"
    )
    assert set(outcomes) == {"431"} and outcomes["431"] >= BOMBERS, outcomes
    assert all(call.status == 200 and call.complete for call, _ in calls), [c.status for c, _ in calls]
    assert slowest < SERVED_WITHIN_S
    assert peak - idle < GROWTH
    ledger = await read_ledger(gw.db_url)  # type: ignore[attr-defined]
    assert len(ledger.started) == 1 + len(calls)  # the bombs made no calls


async def test_an_upstream_header_line_that_never_ends_is_a_502_and_holds_no_call_up(
    big_upstream: Process, tmp_path: Path
) -> None:
    gw = await _gateway(tmp_path, big_upstream.url)  # type: ignore[attr-defined]
    pid = gw.proc.pid  # type: ignore[union-attr]
    small = {"x-test-body-bytes": "1000"}
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            await raw_call(http, gw.url, chat_body("warm", max_tokens=2, stream=False), headers=small)  # type: ignore[attr-defined]
            idle = _rss(pid, "VmRSS")
            _reset_peak(pid)
            bomb = {"x-test-head-line-bytes": str(UPSTREAM_LINE)}
            body = chat_body("bomb", max_tokens=2, stream=False)
            bombs = asyncio.gather(*(raw_call(http, gw.url, body, headers=bomb) for _ in range(UPSTREAM_BOMBS)))  # type: ignore[attr-defined]
            calls = await _calls_until(gw.url, bombs, headers=small)  # type: ignore[attr-defined]
            bombed = await bombs
            calls += await _calls_until(gw.url, asyncio.get_running_loop().time() + 2, headers=small)  # type: ignore[attr-defined]
        peak = _rss(pid, "VmHWM")
    finally:
        gw.stop()
    slowest = max(took for _, took in calls)
    print(
        f"\nUPSTREAM HEAD BOMBS {[b.status for b in bombed]}; {len(calls)} calls, slowest {slowest:.2f} s; "
        f"RSS idle {idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB"
    )
    for answer in bombed:
        assert answer.status == 502, answer
        assert b'"code":"upstream_reset"' in answer.body and b"response head exceeds" in answer.body
    assert all(call.status == 200 and call.complete for call, _ in calls), [c.status for c, _ in calls]
    assert slowest < SERVED_WITHIN_S
    assert peak - idle < GROWTH
    ledger = await read_ledger(gw.db_url)  # type: ignore[attr-defined]
    failed = [ledger.failed[str(b.call_id)] for b in bombed]
    assert [f.reason for f in failed] == ["upstream_reset"] * UPSTREAM_BOMBS
