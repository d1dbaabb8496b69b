"""An absurd token count entering through the real gateway or `ledger import` (red team, round three, point 1).

Before the plausibility rule, a usage of `"prompt_tokens": 9223372036854775808` got its 200 through and then
every projection pass failed (SQLite: "Python int too large to convert to SQLite INTEGER"; PostgreSQL: "value
out of int64 range"), `report runs` exited 2 and every dashboard page answered 500, for good. Now the event keeps
the count as received and says `implausible`, the projections reach the head, and every reader answers.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from tests.gateway import processes
from tests.gateway.live import serving
from tests.gateway.upstream import read_body
from tests.reliability.helpers import ledger_cli
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.read import iter_events
from usage_ledger.projections.engine import projection_status

_ABSURD = 2**63


class _AbsurdUpstream:
    """Chat completions whose usage counts 2⁶³ prompt tokens (a stream's usage chunk too)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = msgspec.json.decode(await read_body(receive))
        usage = {"prompt_tokens": _ABSURD, "completion_tokens": 2, "total_tokens": _ABSURD + 2}
        message = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        if request.get("stream"):
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
            parts = [
                {**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
                {**chunk, "choices": [], "usage": usage},
            ]
            body = b"".join(b"data: " + msgspec.json.encode(p) + b"\n\n" for p in parts) + b"data: [DONE]\n\n"
            kind = b"text/event-stream"
        else:
            body = msgspec.json.encode(
                {"id": "x", "object": "chat.completion", "model": "m", "choices": [message], "usage": usage}
            )
            kind = b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": body})


async def _projections_at_head(db_url: str, timeout_s: float = 60.0) -> None:
    database = open_database(db_url, null_pool=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            status = [s for s in await projection_status(database) if s.live]
            if status and all(s.lag == 0 for s in status):
                return
            assert time.monotonic() < deadline, f"projections stuck: {status}"
            await asyncio.sleep(0.2)
    finally:
        await database.dispose()


async def _recorded_usage(db_url: str) -> list[tuple[str, str]]:
    """(usage_source, usage_detail) of every call's final or imported event."""
    database = open_database(db_url, null_pool=True)
    try:
        found = []
        async for event in iter_events(database):
            body = msgspec.json.decode(event.payload)
            if event.type in ("call.finished", "call.imported"):
                found.append((body["usage_source"], body["usage_detail"]))
        return found
    finally:
        await database.dispose()


async def _readers_answer(db_url: str, run: str) -> list[dict[str, Any]]:
    report = await ledger_cli("report", "runs", "--db", db_url, "--run", run, "--format", "json")
    assert report.returncode == 0, report.stderr
    for kind in ("tickers", "daily"):
        other = await ledger_cli("report", kind, "--db", db_url, "--format", "json")
        assert other.returncode == 0, other.stderr
    rows: list[dict[str, Any]] = msgspec.json.decode(report.stdout)
    return rows


async def test_an_absurd_usage_through_the_gateway_is_recorded_and_read(backend_url: str, tmp_path: Path) -> None:
    processes.upgrade(backend_url)
    async with serving(_AbsurdUpstream()) as upstream:
        gw = processes.gateway(tmp_path, upstream, backend_url)
        await asyncio.to_thread(gw.start)
        base = gw.url  # type: ignore[attr-defined]
        try:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                headers = {"X-Ledger-Run": "absurd"}
                for stream in (False, True):
                    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
                    answer = await client.post("/v1/chat/completions", json=body, headers=headers)
                    assert answer.status_code == 200
                    if not stream:
                        assert answer.json()["usage"]["prompt_tokens"] == _ABSURD  # passed through as sent
                assert (await client.get("/_ledger/health")).status_code == 200
                await _projections_at_head(backend_url)
                for page in (
                    "/_ledger/ui/",
                    "/_ledger/ui/daily",
                    "/_ledger/ui/eras",
                    "/_ledger/ui/calls",
                    "/_ledger/ui/run?run=absurd",
                ):
                    assert (await client.get(page)).status_code == 200, page
                assert (await client.get("/_ledger/api/runs")).status_code == 200
                metrics = (await client.get("/_ledger/metrics")).text
                assert 'ledger_gateway_usage_total{source="implausible"} 2' in metrics
        finally:
            await asyncio.to_thread(gw.stop)
    recorded = await _recorded_usage(backend_url)
    assert [source for source, _ in recorded] == ["implausible", "implausible"]
    assert all(f"prompt_tokens {_ABSURD} is above" in detail for _, detail in recorded)
    (run,) = await _readers_answer(backend_url, "absurd")
    assert (run["calls"], run["input_tokens"], run["output_tokens"]) == (2, 0, 4)


async def test_an_absurd_count_through_import_is_kept_and_read(backend_url: str, tmp_path: Path) -> None:
    processes.upgrade(backend_url)
    path = tmp_path / "calls.jsonl"
    rows = [
        {"started_at": 1_770_000_000 + 10 * i, "elapsed_s": 5, "run": "imp", "input_tokens": tokens, "output_tokens": 7}
        for i, tokens in enumerate([_ABSURD, 2**62, 2**62, 100])
    ]
    path.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in rows))
    imported = await ledger_cli("import", str(path), "--db", backend_url)
    assert imported.returncode == 0, imported.stderr
    recorded = await _recorded_usage(backend_url)
    assert [source for source, _ in recorded] == ["implausible"] * 3 + ["imported"]
    (run,) = await _readers_answer(backend_url, "imp")
    assert (run["calls"], run["input_tokens"], run["output_tokens"]) == (4, 100, 28)
    negative = tmp_path / "negative.jsonl"
    negative.write_bytes(msgspec.json.encode({**rows[0], "input_tokens": -1}) + b"\n")
    refused = await ledger_cli("import", str(negative), "--db", backend_url)
    assert refused.returncode == 2 and f"{negative}:1: input_tokens: must be >= 0" in refused.stderr
