"""Fault injection, client disconnects and `/metrics` counters."""

from __future__ import annotations

import asyncio
import re

import httpx
import msgspec
import pytest

from usage_ledger.emulator import parse_faults, profile_config, running_emulator
from usage_ledger.emulator.faults import FaultError

FAST = profile_config("moe", speed=1000.0)


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, name
    return total


def test_parse_faults() -> None:
    f = parse_faults(["error-mid-stream=2, slow-headers=0.5", "status=503"])
    assert (f.error_after, f.slow_headers_s, f.status, f.drop_after) == (2, 0.5, 503, None)
    assert parse_faults(["drop-mid-stream"]).drop_after == 3
    for bad in ("explode", "status=200", "error-mid-stream=x"):
        with pytest.raises(FaultError):
            parse_faults([bad])


async def test_error_mid_stream() -> None:
    body = {"prompt": "x", "max_tokens": 50, "min_tokens": 50, "stream": True}
    async with running_emulator(FAST) as emu, httpx.AsyncClient() as h:
        r = await h.post(
            emu.base_url + "/v1/completions", json=body, headers={"X-Emulator-Fault": "error-mid-stream=2"}
        )
    events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert r.status_code == 200
    assert events[-1] == "[DONE]"
    err = msgspec.json.decode(events[-2])["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert len(events) == 4  # two content chunks, the error, [DONE]


async def test_drop_mid_stream() -> None:
    body = {"prompt": "x", "max_tokens": 5000, "min_tokens": 5000, "stream": True}
    async with running_emulator(FAST) as emu, httpx.AsyncClient() as h:
        with pytest.raises(httpx.RemoteProtocolError):
            async with h.stream(
                "POST", emu.base_url + "/v1/completions", json=body, headers={"X-Emulator-Fault": "drop-mid-stream=1"}
            ) as r:
                async for _ in r.aiter_bytes():
                    pass
        assert emu.records()[-1].finish_reason == "abort"


async def test_status_fault_and_cli_default_fault() -> None:
    async with running_emulator(FAST, faults=("status=503",)) as emu, httpx.AsyncClient() as h:
        r = await h.post(emu.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == 503


async def test_client_disconnect_aborts_and_frees_slot() -> None:
    # One slot; a stream that would take a very long time holds it until the client leaves.
    cfg = profile_config("moe", speed=1.0, max_num_seqs=1)
    async with running_emulator(cfg) as emu, httpx.AsyncClient(timeout=30) as h:
        body = {"prompt": "x", "max_tokens": 100_000 // 4, "min_tokens": 100_000 // 4, "stream": True}
        async with h.stream("POST", emu.base_url + "/v1/completions", json=body) as r:
            async for _ in r.aiter_bytes():
                break  # first bytes arrived: the request is running
        for _ in range(200):
            if emu.records():
                break
            await asyncio.sleep(0.01)
        assert [rec.finish_reason for rec in emu.records()] == ["abort"]
        # the slot is free again: a short request completes
        r2 = await h.post(emu.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r2.json()["usage"]["completion_tokens"] == 2
        metrics = (await h.get(emu.base_url + "/metrics")).text
        assert _metric(metrics, "vllm:request_success_total", finished_reason="abort") == 1
        assert _metric(metrics, "vllm:num_requests_running") == 0


async def test_metrics_after_known_requests() -> None:
    n, prompt_tokens, out = 6, 25, 30
    async with running_emulator(FAST) as emu, httpx.AsyncClient() as h:
        body = {"prompt": "abcd" * prompt_tokens, "max_tokens": out, "min_tokens": out, "model": "emulator-moe"}
        await asyncio.gather(*(h.post(emu.base_url + "/v1/completions", json=body) for _ in range(n)))
        text = (await h.get(emu.base_url + "/metrics")).text
    labels = {"model_name": "emulator-moe", "engine": "0"}
    assert _metric(text, "vllm:prompt_tokens_total", **labels) == n * prompt_tokens
    assert _metric(text, "vllm:generation_tokens_total", **labels) == n * out
    assert _metric(text, "vllm:request_success_total", finished_reason="length") == n
    assert _metric(text, "vllm:time_to_first_token_seconds_count") == n
    assert _metric(text, "vllm:e2e_request_latency_seconds_count") == n
    # every token after the first comes from a decode step; each step emits 1 + accepted drafts
    drafts = _metric(text, "vllm:spec_decode_num_drafts_total")
    accepted = _metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert _metric(text, "vllm:spec_decode_num_draft_tokens_total") == drafts * FAST.spec_tokens
    per_pos = _metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0")
    assert per_pos == accepted
    assert n * (out - 1) <= drafts + accepted <= n * out + n  # the last step may be capped
    assert _metric(text, "vllm:inter_token_latency_seconds_count") == drafts
    assert re.search(r'^vllm:num_requests_waiting\{engine="0",model_name="emulator-moe"\} 0\.0$', text, re.M)
