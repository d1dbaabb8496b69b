"""The profiles reproduce the seed's aggregate throughput (DESIGN §7), in emulated time.

Scaled-down seed workload: each client sends 17 calls back to back (one ticker's worth),
prompt 10.8k tokens, natural output length (mean 1470). Throughput is computed from the
emulator's own reported timings (`/emulator/requests`), never from the wall clock.
"""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import pytest

from usage_ledger.emulator import PROFILES, RequestRecord, profile_config, running_emulator, simulate

SEED_TPS = {"moe": (14, 911.0), "dense": (3, 118.0)}


@pytest.mark.parametrize("profile", ["moe", "dense"])
def test_simulated_full_seed_workload(profile: str) -> None:
    clients, target = SEED_TPS[profile]
    result = simulate(PROFILES[profile], clients=clients, calls=400)
    assert result.throughput_tps == pytest.approx(target, rel=0.05)


@pytest.mark.parametrize("profile", ["moe", "dense"])
async def test_loopback_aggregate_throughput(profile: str) -> None:
    clients, target = SEED_TPS[profile]
    calls_per_client = 17
    cfg = profile_config(profile, speed=400.0)

    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=120) as h:

        async def client(c: int) -> None:
            for k in range(calls_per_client):
                prompt = f"client {c} call {k} ".ljust(10_800 * 4, ".")
                body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0.8}
                r = await h.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text

        await asyncio.gather(*(client(c) for c in range(clients)))
        records = msgspec.json.decode((await h.get("/emulator/requests")).content, type=list[RequestRecord])

    assert len(records) == clients * calls_per_client
    assert all(r.finish_reason == "stop" for r in records)
    out = sum(r.completion_tokens for r in records)
    span = max(r.finished_at for r in records) - min(r.arrival for r in records)
    assert out / span == pytest.approx(target, rel=0.10)
