"""Issue #55: `ledger serve --keep-bodies DAYS` erases the bodies of calls older than DAYS in the background,
while the gateway records calls, and says so in its log and metrics; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import openai

from tests._polling import wait_until
from tests.gateway import processes
from tests.gateway.processes import LEDGER, Process
from tests.ledger.helpers import build_ledger
from tests.retention_seed import Seeded, gone
from usage_ledger.ledger import CallFinished, CallStarted, decode_event, iter_events, open_database


async def _recorded_bodies(url: str) -> list[str]:
    """The request and response bodies of the calls the gateway recorded (not the seed's)."""
    database = open_database(url, null_pool=True)
    found = []
    today = set()
    try:
        async for stored in iter_events(database, 0):
            body = decode_event(stored.payload)
            if isinstance(body, CallStarted) and body.run == "today" and body.request_blob:
                today.add(body.call_id)
                found.append(body.request_blob)
            elif isinstance(body, CallFinished) and body.response_blob and body.call_id in today:
                found.append(body.response_blob)
    finally:
        await database.dispose()
    return found


async def test_old_bodies_are_erased_while_the_gateway_records(
    emulator: Process, backend_url: str, tmp_path: Path
) -> None:
    seed = Seeded()  # runs on 2026-06-01 and -11: more than 90 days before any day this test runs
    await build_ledger(backend_url, seed)
    gateway = processes.gateway(
        tmp_path,
        emulator.url,  # type: ignore[attr-defined]
        backend_url,
        "--keep-bodies",
        "90",
        env={"LEDGER_KEEP_BODIES_INTERVAL_S": "0.5"},
    ).start()
    try:
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1",  # type: ignore[attr-defined]
            api_key="unused",
            default_headers={"X-Ledger-Run": "today"},
        )
        old = [*seed.bodies["old"], *seed.bodies["new"], seed.shared]

        async def recording() -> int:
            calls = 0
            while not all(await gone(backend_url, old)):
                await client.chat.completions.create(
                    model="emulator-moe", messages=[{"role": "user", "content": f"call {calls} of today"}], max_tokens=8
                )
                calls += 1
            return calls

        async with client:
            calls = await asyncio.wait_for(recording(), timeout=120)
        assert calls >= 1
        today = await _recorded_bodies(backend_url)
        assert today and not any(await gone(backend_url, today))  # today's calls keep their bodies

        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{gateway.url}/_ledger/metrics")).text  # type: ignore[attr-defined]
        erased = re.search(r"^ledger_retention_bodies_erased_total (\d+)$", metrics, re.M)
        assert erased is not None and int(erased.group(1)) == len(old)
        assert re.search(r"^ledger_retention_passes_total [1-9]", metrics, re.M)

        def logged() -> list[dict[str, object]]:
            lines = (json.loads(line) for line in gateway.log_path.read_text().splitlines() if line.startswith("{"))
            return [line for line in lines if line.get("event") == "bodies_erased" and line.get("erased")]

        passes = await wait_until(logged, what="a bodies_erased log line")
        assert sum(int(str(p["erased"])) for p in passes) == len(old) and passes[0]["keep_days"] == 90
    finally:
        gateway.stop()
    verify = await asyncio.create_subprocess_exec(LEDGER, "verify", "--db", backend_url)
    assert await verify.wait() == 0
