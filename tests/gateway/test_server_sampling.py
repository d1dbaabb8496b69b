"""`ledger serve` samples the emulator's /metrics; the run report's server block and `ledger reconcile`.

The emulator counts like vLLM (its shape is checked against vLLM 0.32 in tests/emulator); the same
checks run against real vLLM in tests/realvllm.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway import processes
from tests.gateway.processes import LEDGER, Process

EMULATOR_SPEED = 50  # the shared `emulator` and `gateway` fixtures (tests/conftest.py)
GATEWAY_ENV = {"LEDGER_SERVER_SAMPLE_S": "2"}

MODEL = "emulator-moe"


async def _calls(url: str, count: int, *, run: str | None, max_tokens: int = 24) -> None:
    headers = {"x-ledger-run": run} if run else {}
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as http:
        bodies = [
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"ticker {i}: summarise the quarter"}],
                "max_tokens": max_tokens,
                "stream": i % 2 == 0,
                **({"stream_options": {"include_usage": True}} if i % 2 == 0 else {}),
            }
            for i in range(count)
        ]
        replies = await asyncio.gather(*(http.post("/v1/chat/completions", json=b) for b in bodies))
    assert all(r.status_code == 200 for r in replies)


def _ledger(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEDGER, *args, "--db", db], capture_output=True, text=True, timeout=60)


async def _run_row(db: str, run: str) -> dict[str, Any]:
    """The run's report row once its closing sample is in (taken ~1 s after the run goes idle)."""
    for _ in range(100):
        result = await asyncio.to_thread(_ledger, "report", "runs", "--run", run, "--format", "json", db=db)
        assert result.returncode == 0, result.stderr
        (row,) = json.loads(result.stdout)
        if row["server"] is not None and row["server"]["reconciled"] is not None:
            return row  # type: ignore[no-any-return]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no server block for {run}: {row}")


async def test_a_run_through_the_gateway_reconciles(gateway: Process, backend_url: str) -> None:
    await _calls(gateway.url, 12, run="nightly")  # type: ignore[attr-defined]
    row = await _run_row(backend_url, "nightly")
    server = row["server"]
    assert server["reconciled"] is True, server
    assert server["server_requests"] == row["calls"] == 12
    assert (server["server_prompt_tokens"], server["server_generation_tokens"]) == (
        row["input_tokens"],
        row["output_tokens"],
    )
    assert 0 < server["spec_decode_acceptance_rate"] < 1  # the moe profile drafts with MTP
    assert server["spec_decode_mean_acceptance_length"] > 1
    assert server["config"] is not None and server["config"]["cache_dtype"] == "fp8"  # the moe profile
    assert "counter deltas" in server["sources"]["server_requests"]
    result = await asyncio.to_thread(_ledger, "reconcile", db=backend_url)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_calls_that_bypass_the_gateway_show_as_the_gap(
    gateway: Process, emulator: Process, backend_url: str
) -> None:
    await asyncio.gather(
        _calls(gateway.url, 8, run="bypassed"),  # type: ignore[attr-defined]
        _calls(emulator.url, 3, run=None, max_tokens=10),  # type: ignore[attr-defined]  # straight to the server
    )
    row = await _run_row(backend_url, "bypassed")
    assert row["server"]["reconciled"] is False
    difference = row["server"]["difference"]
    assert difference["requests"] == 3 and difference["generation_tokens"] == 3 * 10, json.dumps(row["server"])
    assert difference["prompt_tokens"] > 0
    result = await asyncio.to_thread(_ledger, "reconcile", "--format", "json", db=backend_url)
    assert result.returncode == 1
    (listed,) = json.loads(result.stdout)
    assert listed["run"] == "bypassed" and listed["requests_difference"] == 3


async def test_runs_back_to_back_reconcile_and_calls_around_the_gateway_are_caught(
    gateway: Process, emulator: Process, backend_url: str
) -> None:
    """Issue #53: repeated runs sent one after another (no idle moment between them) reconcile, checked
    together; three calls sent straight to the server during a fourth run are caught and named."""
    for run in ("qwk-1", "qwk-2", "qwk-3"):
        await _calls(gateway.url, 6, run=run)  # type: ignore[attr-defined]
    await _run_row(backend_url, "qwk-3")  # its closing (idle) sample is in: the fourth run starts after it
    await asyncio.gather(
        _calls(gateway.url, 6, run="qwk-4"),  # type: ignore[attr-defined]
        _calls(emulator.url, 3, run=None, max_tokens=10),  # type: ignore[attr-defined]  # straight to the server
    )
    await _run_row(backend_url, "qwk-4")
    result = await asyncio.to_thread(_ledger, "reconcile", "--all", "--format", "json", db=backend_url)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {row["run"]: row for row in json.loads(result.stdout)}
    assert [rows[run]["reconciled"] for run in ("qwk-1", "qwk-2", "qwk-3")] == [True] * 3, result.stdout
    assert rows["qwk-4"]["reconciled"] is False and rows["qwk-4"]["requests_difference"] == 3, result.stdout
    assert rows["qwk-4"]["generation_tokens_difference"] == 3 * 10
    assert rows["qwk-4"]["window_calls"] == 6 and rows["qwk-4"]["server_requests"] == 9  # its window: its own
    assert "bypassed the gateway" in rows["qwk-4"]["note"] and "shared" not in rows["qwk-4"]["note"]


_BLOCKS = ("--enable-per-request-metrics", "--per-request-spec-decode-metrics", "summary")


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [False, True], ids=["counters", "per-request blocks"])
async def test_the_moe_profiles_acceptance_over_a_run(backend_url: str, tmp_path: Path, blocks: bool) -> None:
    """DESIGN §7: MTP acceptance ≈ 50.1 % on the MoE model; the run's block says so within ±1 %, from the
    server's counters, or from every call's own block when the server sends them (then those are preferred)."""
    emulator = processes.emulator(tmp_path, *(_BLOCKS if blocks else ()), speed=1e5).start()
    try:
        processes.upgrade(backend_url)
        gateway = processes.gateway(tmp_path, emulator.url, backend_url).start()  # type: ignore[attr-defined]
        try:
            for _ in range(10):
                await _calls(gateway.url, 30, run="acceptance", max_tokens=200)  # type: ignore[attr-defined]
            row = await _run_row(backend_url, "acceptance")
        finally:
            gateway.stop()
    finally:
        emulator.stop()
    server = row["server"]
    assert server["reconciled"] is True, server
    assert server["spec_decode_acceptance_rate"] == pytest.approx(0.501, abs=0.01), server
    source = server["sources"]["spec_decode_acceptance_rate"]
    if blocks:
        assert source == "vllm per-request speculative_decoding blocks summed over 300 calls"
    else:
        assert source.startswith("vllm counter deltas"), source
