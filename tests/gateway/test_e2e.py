"""End to end: the real emulator and the real `ledger serve` as processes, the real openai SDK."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tests._polling import wait_until
from tests.gateway import processes
from tests.gateway.processes import Process
from tests.gateway.wire import read_response
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted, Event
from usage_ledger.ledger.read import iter_events

MODEL = "emulator-moe"


async def ledger_events(db_url: str) -> list[Event]:
    database = open_database(db_url, null_pool=True)
    try:
        return [e.body() async for e in iter_events(database)]
    finally:
        await database.dispose()


def sdk(url: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-e2e-secret", default_headers=headers, max_retries=0)


async def test_sdk_streams_and_calls_are_recorded(gateway: Process, emulator: Process, backend_url: str) -> None:
    client = sdk(gateway.url, **{"X-Ledger-Run": "e2e", "X-Ledger-Ticker": "T1"})  # type: ignore[attr-defined]
    direct = sdk(emulator.url)  # type: ignore[attr-defined]
    messages = [{"role": "user", "content": "Summarise the quarter."}]

    async def one_stream(i: int) -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            stream=True,
            max_tokens=20 + i,
            extra_body={"min_tokens": 20 + i},  # type: ignore[arg-type]
        )
        text, chunks = "", 0
        async for chunk in stream:
            assert chunk.usage is None and chunk.choices  # the injected usage chunk never reaches the client
            text += chunk.choices[0].delta.content or ""
            chunks += 1
        return text, chunks

    await asyncio.gather(*(one_stream(i) for i in range(6)))
    plain = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    reference = await direct.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    assert plain.choices[0].message.content == reference.choices[0].message.content
    assert plain.usage == reference.usage
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    call_id = raw.headers["x-ledger-call-id"]
    await client.close()
    await direct.close()

    events = await ledger_events(backend_url)
    started = [e for e in events if isinstance(e, CallStarted)]
    finished = [e for e in events if isinstance(e, CallFinished)]
    assert len(started) == len(finished) == 8
    assert {e.run for e in started} == {"e2e"} and all(e.tags == {"ticker": "T1"} for e in started)
    assert all(dict(e.request_headers)["authorization"].startswith("hmac-sha256:") for e in started)
    streamed = sorted((e for e in finished if e.usage_source == "injected"), key=lambda e: e.usage.completion_tokens)  # type: ignore[union-attr]
    assert [e.usage.completion_tokens for e in streamed] == [20 + i for i in range(6)]  # type: ignore[union-attr]
    assert all(e.timings.first_token is not None for e in streamed)
    assert call_id in {e.call_id for e in finished}
    verify = await asyncio.to_thread(
        subprocess.run, [processes.LEDGER, "verify", "--db", backend_url], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    log = gateway.log_path.read_text()
    assert "call_proxied" in log and "sk-e2e-secret" not in log and "Summarise" not in log


async def test_upstream_faults_through_the_gateway(gateway: Process, backend_url: str) -> None:
    client = sdk(gateway.url)  # type: ignore[attr-defined]
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            extra_headers={"X-Emulator-Fault": "status=503"},  # type: ignore[arg-type]
        )
    assert info.value.status_code == 503
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        max_tokens=30,  # type: ignore[arg-type]
        extra_headers={"X-Emulator-Fault": "error-mid-stream=2"},
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        max_tokens=30,  # type: ignore[arg-type]
        extra_headers={"X-Emulator-Fault": "drop-mid-stream=2"},
    )
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        async for _ in stream:
            pass
    await client.close()

    async def failures() -> dict[str, CallFailed] | None:
        failed = {e.reason: e for e in await ledger_events(backend_url) if isinstance(e, CallFailed)}
        return failed if len(failed) == 2 else None

    failed = await wait_until(failures, what="both failures recorded")
    assert set(failed) == {"upstream_error_in_stream", "upstream_reset"}
    assert failed["upstream_reset"].chunk_count >= 2


async def test_unreachable_upstream_502(backend_url: str, tmp_path: Path) -> None:
    processes.upgrade(backend_url)
    dead = f"http://127.0.0.1:{processes.free_port()}"
    proc = processes.gateway(tmp_path, dead, backend_url).start()
    try:
        async with httpx.AsyncClient() as http:
            resp = await http.post(proc.url + "/v1/chat/completions", json={"model": MODEL, "messages": []})  # type: ignore[attr-defined]
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_unreachable"
    finally:
        proc.stop()
    failed = [e for e in await ledger_events(backend_url) if isinstance(e, CallFailed)]
    assert [e.reason for e in failed] == ["upstream_unreachable"]


def test_serve_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    result = subprocess.run(
        [processes.LEDGER, "serve", "--db", db, "--port", str(processes.free_port())], capture_output=True, text=True
    )
    assert result.returncode == 2 and "ledger db upgrade" in result.stderr


async def test_client_disconnect_cancels_upstream(gateway: Process, emulator: Process, backend_url: str) -> None:
    def aborts() -> float:
        text = httpx.get(emulator.url + "/metrics").text  # type: ignore[attr-defined]
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total") and 'finished_reason="abort"' in line
        )

    before = aborts()
    client = sdk(gateway.url)  # type: ignore[attr-defined]
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "long"}],
        stream=True,  # type: ignore[arg-type]
        max_tokens=20000,
        extra_body={"min_tokens": 20000},
    )
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 3:
            break
    await stream.close()
    await client.close()
    await wait_until(lambda: aborts() > before, every_s=0.05, what="the emulator's request aborted")
    assert aborts() == before + 1

    async def failures() -> list[CallFailed]:
        return [e for e in await ledger_events(backend_url) if isinstance(e, CallFailed)]

    failed = await wait_until(failures, every_s=0.1, what="the call's failure recorded")
    assert [(e.reason, e.phase) for e in failed] == [("client_disconnected", "stream")]
    assert failed[0].chunk_count >= 3
    # the output it saw, with its own provenance: no usage came, so the content deltas were counted
    assert failed[0].usage_source == "counted" and failed[0].usage is not None
    assert failed[0].usage.completion_tokens >= 2 and failed[0].usage.prompt_tokens == 0


def _chat(body: bytes, *, chunked: bool = False) -> bytes:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\nx-ledger-run: wire\r\n"
    if chunked:
        half = len(body) // 2
        parts = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (body[:half], body[half:]))
        return head + b"transfer-encoding: chunked\r\n\r\n" + parts + b"0\r\n\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


async def test_real_server_keep_alive_pipelining_chunked_malformed_and_admin(
    emulator: Process, backend_url: str, tmp_path: Path
) -> None:
    """`ledger serve` on the wire: one connection for several calls, a pipelined pair, a chunked body,
    a malformed request; the admin API through the ASGI adapter with its token; the SDK on keep-alive."""
    processes.upgrade(backend_url)
    gw = processes.gateway(tmp_path, emulator.url, backend_url, env={"LEDGER_ADMIN_TOKEN": "tok"}).start()  # type: ignore[attr-defined]
    plain = b'{"model":"emulator-moe","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
    stream = b'{"model":"emulator-moe","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}'
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)  # type: ignore[attr-defined]
        ids = []
        for request in (_chat(plain), _chat(plain, chunked=True), _chat(plain)):  # keep-alive, one connection
            writer.write(request)
            status, headers, body = await read_response(reader)
            assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
            ids.append(headers["x-ledger-call-id"])
        writer.write(_chat(stream) + _chat(plain))  # a pipelined pair: answered in order
        first, second = await read_response(reader), await read_response(reader)
        assert first[1]["content-type"].startswith("text/event-stream") and first[2].endswith(b"data: [DONE]\n\n")
        assert b'"usage"' not in first[2] and json.loads(second[2])["usage"]["completion_tokens"] == 3
        ids += [first[1]["x-ledger-call-id"], second[1]["x-ledger-call-id"]]
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: x\r\n\r\n")  # malformed
        status, headers, _ = await read_response(reader)
        assert status == 400 and headers["connection"] == "close" and await reader.read() == b""
        writer.close()

        client = sdk(gw.url)  # type: ignore[attr-defined]
        for _ in range(3):  # the SDK reuses its connection
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                max_tokens=2,  # type: ignore[arg-type]
            )
            ids.append(raw.headers["x-ledger-call-id"])
        await client.close()

        async with httpx.AsyncClient(base_url=gw.url) as http:  # type: ignore[attr-defined]
            assert (await http.get("/_ledger/health")).json()["status"] == "ok"
            assert (await http.get("/_ledger/metrics")).status_code == 401
            auth = {"authorization": "Bearer tok"}
            metrics = (await http.get("/_ledger/metrics", headers=auth)).text
            assert 'ledger_gateway_calls_total{status="200"} 8' in metrics
            assert (await http.get("/_ledger/api/schema/openapi.json", headers=auth)).status_code == 200
            events = (await http.get(f"/_ledger/api/calls/{ids[1]}/events", headers=auth)).json()
            assert [e["type"] for e in events["events"]] == ["call.started", "call.finished"]
    finally:
        gw.stop()
    assert len(set(ids)) == 8
    finished = {e.call_id for e in await ledger_events(backend_url) if isinstance(e, CallFinished)}
    assert set(ids) == finished
    assert "gateway_listening" in gw.log_path.read_text()
