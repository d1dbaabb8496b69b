"""Client disconnects at random points: the upstream request is cancelled, the partial call recorded.

Points: before the response headers (client timeout during `slow-headers`), right after the
headers, and after a random number of SSE chunks. Each must abort exactly one request in the
emulator (`vllm:request_success_total{finished_reason="abort"}`) and leave a `call.failed`
(`client_disconnected`) holding what was relayed: chunk count, bytes sent, the partial stream.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import chat_body, read_blobs, read_ledger, verify_fast

pytestmark = pytest.mark.slow

POINTS = 12


async def _aborts(http: httpx.AsyncClient, emulator_url: str) -> float:
    text = (await http.get(emulator_url + "/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total") and 'finished_reason="abort"' in line
    )


async def test_random_disconnects_cancel_upstream(emulator: Process, tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db_url)
    gw = processes.gateway(tmp_path, emulator.url, db_url)  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)
    rng = random.Random(99)
    seen: dict[str, int] = {}  # call id -> SSE events the client read before leaving
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            before = await _aborts(http, emulator.url)  # type: ignore[attr-defined]
            long = chat_body("long", max_tokens=4000, stream=True, min_tokens=4000)
            # before the response headers: the client gives up while the upstream is still silent
            with pytest.raises(httpx.ReadTimeout):
                await http.post(
                    gw.url + "/v1/chat/completions",  # type: ignore[attr-defined]
                    content=long,
                    headers={"X-Emulator-Fault": "slow-headers=0.6", "content-type": "application/json"},
                    timeout=httpx.Timeout(10, read=0.2),
                )
            for point in range(POINTS):
                stop_after = 0 if point == 0 else rng.randint(1, 40)
                async with http.stream(
                    "POST",
                    gw.url + "/v1/chat/completions",  # type: ignore[attr-defined]
                    content=long,
                    headers={"content-type": "application/json"},
                ) as response:
                    assert response.status_code == 200
                    events = 0
                    async for chunk in response.aiter_raw():
                        events += chunk.count(b"data: ")
                        if events >= stop_after:
                            break
                    seen[response.headers["x-ledger-call-id"]] = events
                await asyncio.sleep(rng.uniform(0, 0.1))
            expected = before + POINTS + 1
            for _ in range(100):
                if await _aborts(http, emulator.url) >= expected:  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the slow-headers request aborts once its headers were due
            assert await _aborts(http, emulator.url) == expected  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(gw.stop)

    ledger = await read_ledger(db_url)
    assert len(ledger.started) == POINTS + 1 and not ledger.finished and not ledger.incomplete
    assert {f.reason for f in ledger.failed.values()} == {"client_disconnected"}
    headerless = [f for f in ledger.failed.values() if f.client_status is None]
    assert len(headerless) == 1 and headerless[0].phase == "stream" and headerless[0].chunk_count == 0
    blobs = await read_blobs(db_url, [f.response_blob for f in ledger.failed.values() if f.response_blob])
    for call_id, events in seen.items():
        failed = ledger.failed[call_id]
        assert failed.client_status == 200 and failed.chunk_count >= events and failed.client_bytes > 0
        assert failed.timings.upstream_headers is not None
        if events:
            assert failed.timings.first_token is not None
            partial = blobs[failed.response_blob]  # type: ignore[index]
            assert partial.count(b"data: ") >= events and b"[DONE]" not in partial
    await verify_fast(db_url)
    print(
        f"\nDISCONNECTS: points={POINTS + 1} read_events={sorted(seen.values())} "
        f"recorded_chunks={sorted(f.chunk_count for f in ledger.failed.values())} upstream_aborts={POINTS + 1}"
    )
