"""Reliability, end to end: kill -9 mid-stream, and a database outage bridged by the spool.

`TcpCut` lives in tests/gateway/relay.py; it is imported here too for the tests that import it from here."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tests._polling import wait_until
from tests.gateway import processes
from tests.gateway.processes import Process
from tests.gateway.relay import RelayedGateway, TcpCut  # noqa: F401 - TcpCut: still importable from here
from tests.gateway.test_e2e import MODEL, ledger_events, sdk
from usage_ledger.ledger.events import CallFinished, CallStarted

pytestmark = pytest.mark.slow

# real-time speed for the shared `emulator` fixture (tests/conftest.py): a flood of chunks would only measure an
# overloaded CPU
EMULATOR_SPEED = 1


async def verify(db_url: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [processes.LEDGER, "verify", "--db", db_url], capture_output=True, text=True
    )


async def test_kill_9_during_concurrent_streams(emulator: Process, backend_url: str, tmp_path: Path) -> None:
    processes.upgrade(backend_url)
    gw = processes.gateway(tmp_path, emulator.url, backend_url).start()  # type: ignore[attr-defined]
    client = sdk(gw.url)  # type: ignore[attr-defined]
    done = [
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"before {i}"}], max_tokens=3
        )
        for i in range(3)
    ]  # strict durability: these are committed before their last byte reached us
    progress = [0] * 14

    async def stream(i: int) -> None:
        response = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"ticker {i}"}],
            stream=True,
            max_tokens=5_000,
            extra_body={"min_tokens": 5_000},
        )
        async for _ in response:
            progress[i] += 1

    tasks = [asyncio.create_task(stream(i)) for i in range(14)]

    async def flowing() -> bool:  # every stream flows and its call.started is committed
        started = [e for e in await ledger_events(backend_url) if isinstance(e, CallStarted)]
        return len(started) == 17 and min(progress) >= 3

    await wait_until(flowing, every_s=0.1, what="17 calls started, every stream flowing")
    gw.kill()  # SIGKILL mid-stream: no shutdown, no flush
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, openai.APIError | httpx.HTTPError) for r in results), results
    await client.close()
    gw.log.close()

    events = await ledger_events(backend_url)
    started = [e for e in events if isinstance(e, CallStarted)]
    finished = [e for e in events if isinstance(e, CallFinished)]
    assert len(started) == 17 and len(finished) == 3
    assert {e.call_id for e in finished} <= {e.call_id for e in started}
    assert {c.id.removeprefix("chatcmpl-") for c in done} == {e.upstream_request_id for e in finished}
    assert (await verify(backend_url)).returncode == 0

    again = processes.gateway(tmp_path, emulator.url, backend_url, port=gw.port).start()  # type: ignore[attr-defined]
    try:
        client = sdk(again.url)  # type: ignore[attr-defined]
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "after"}], max_tokens=2)
        await client.close()
    finally:
        again.stop()
    assert (await verify(backend_url)).returncode == 0
    assert len([e for e in await ledger_events(backend_url) if isinstance(e, CallFinished)]) == 4


async def test_database_outage_spools_and_replays(relayed_gateway: RelayedGateway, fresh_pg_url: str) -> None:
    gw, relay = relayed_gateway.gateway, relayed_gateway.relay
    client = sdk(gw.url)  # type: ignore[attr-defined]
    health_url = gw.url + "/_ledger/health"  # type: ignore[attr-defined]

    async def call(i: int, stream: bool = False) -> None:
        messages = [{"role": "user", "content": f"outage {i}"}]
        if stream:
            async for _ in await client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=5,
                stream=True,  # type: ignore[arg-type]
            ):
                pass
        else:
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)  # type: ignore[arg-type]

    try:
        await call(0)
        await relay.cut()
        await asyncio.gather(*(call(i, stream=i % 2 == 0) for i in range(1, 9)))  # proxying continues
        async with httpx.AsyncClient() as http:
            health = (await http.get(health_url)).json()
            assert health["spooling"] and health["spool_bytes"] > 0
            await relay.start()
            for i in range(100):  # each commit attempt retries the database at most once a second
                await call(100 + i)
                if not (await http.get(health_url)).json()["spooling"]:
                    break
                await asyncio.sleep(0.3)
            assert not (await http.get(health_url)).json()["spooling"]
    finally:
        await client.close()

    events = await ledger_events(fresh_pg_url)
    finished = [e for e in events if isinstance(e, CallFinished)]
    started = {e.call_id for e in events if isinstance(e, CallStarted)}
    assert len(finished) >= 10 and {e.call_id for e in finished} == started
    assert (await verify(fresh_pg_url)).returncode == 0
