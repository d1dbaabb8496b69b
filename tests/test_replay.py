"""`ledger replay`: a run recorded through `ledger serve` against the `moe` emulator, replayed to another.

The original is recorded by the real gateway process; the replay goes through the in-process
gateway `ledger replay` starts. Bodies are compared from the blob store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import msgspec
import pytest
from sqlalchemy import select

from tests.gateway import processes
from tests.gateway.processes import LEDGER, Process
from usage_ledger.answers.callviews import iter_calls
from usage_ledger.answers.compare import compare_runs
from usage_ledger.answers.reports import runs_report
from usage_ledger.ledger.blobs import read_blob
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallStarted, decode_event
from usage_ledger.ledger.schema import events
from usage_ledger.processes import free_port
from usage_ledger.projections.rows import CallView
from usage_ledger.replay.plan import max_in_flight, with_model

RUN = "moe-night"
CALLS = 16


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    proc = processes.emulator(tmp_path_factory.mktemp("moe"), speed=50).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    proc = processes.emulator(tmp_path_factory.mktemp("dense"), "--profile", "dense", speed=50).start()
    try:
        yield proc
    finally:
        proc.stop()


def _bodies() -> list[tuple[str, dict[str, object]]]:
    """Chat calls, streamed and not (one stream asking for usage itself), and legacy completions."""
    out: list[tuple[str, dict[str, object]]] = []
    for i in range(CALLS):
        if i % 5 == 4:
            out.append(
                ("/v1/completions", {"model": "emulator-moe", "prompt": f"step {i}: the outlook", "max_tokens": 40})
            )
            continue
        body: dict[str, object] = {
            "messages": [{"role": "user", "content": f"step {i}: summarise the quarter, naïvely"}],
            "model": "emulator-moe",
            "max_tokens": 48,
            "temperature": 0.8,
            "stream": i % 2 == 0,
        }
        if i == 2:
            body["stream_options"] = {"include_usage": True}
        out.append(("/v1/chat/completions", body))
    return out


async def _record(url: str) -> None:
    """The original run: 4 tickers, tagged steps, 4 calls at once, a client key the replay must not send."""
    slots = asyncio.Semaphore(4)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:

        async def one(i: int, path: str, body: dict[str, object]) -> None:
            headers = {
                "X-Ledger-Run": RUN,
                "X-Ledger-Ticker": f"T{i % 4}",
                "X-Ledger-Tag-step": str(i),
                "Authorization": "Bearer sk-original-secret",
                "Content-Type": "application/json",
            }
            async with slots:
                # a body with spacing json.dumps would not produce: the replay must keep it
                response = await http.post(path, content=json.dumps(body, indent=1).encode(), headers=headers)
            assert response.status_code == 200, response.text

        await asyncio.gather(*(one(i, path, body) for i, (path, body) in enumerate(_bodies())))


@pytest.fixture
async def recorded(moe: Process, backend_url: str, tmp_path: Path) -> AsyncIterator[Database]:
    """A ledger holding RUN, recorded through `ledger serve` (stopped afterwards: its closing sample is in)."""
    processes.upgrade(backend_url)
    gateway = processes.gateway(tmp_path, _url(moe), backend_url, env={"LEDGER_SERVER_SAMPLE_S": "2"}).start()
    try:
        await _record(_url(gateway))
    finally:
        gateway.stop()
    database = open_database(backend_url, null_pool=True)
    try:
        yield database
    finally:
        await database.dispose()


def _url(proc: Process) -> str:
    url: str = proc.url  # type: ignore[attr-defined]
    return url


def _ledger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LEDGER, *args], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}
    )


def _replay(db: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _ledger("replay", *args, "--db", db, "--spool-dir", str(tmp_path / "replay-spool"))


async def _calls(database: Database, run: str) -> list[CallView]:
    return [view async for view in iter_calls(database, run=run)]


async def _started(database: Database, call_id: str) -> CallStarted:
    async with database.engine.connect() as conn:
        payload = (
            await conn.execute(
                select(events.c.payload).where(events.c.stream == f"call-{call_id}", events.c.type == "call.started")
            )
        ).scalar_one()
    event = decode_event(payload)
    assert isinstance(event, CallStarted)
    return event


async def _body(database: Database, view: CallView) -> bytes:
    assert view.request_blob is not None
    async with database.engine.connect() as conn:
        return await read_blob(conn, view.request_blob)


async def test_moe_run_replayed_on_dense(recorded: Database, dense: Process, backend_url: str, tmp_path: Path) -> None:
    original = await _calls(recorded, RUN)
    assert len(original) == CALLS
    result = _replay(backend_url, tmp_path, RUN, "--upstream", _url(dense), "--model", "emulator-dense")
    assert result.returncode == 0, result.stderr
    peak = max_in_flight([(c.started_at, c.ended_at) for c in original])
    assert f"as run {RUN}-replay-1 ({peak} at once); none of its {CALLS} calls skipped" in result.stdout
    assert f"{CALLS} answered 2xx" in result.stdout

    replay = await _calls(recorded, f"{RUN}-replay-1")
    assert [c.status for c in replay] == ["ok"] * CALLS
    assert {c.model for c in replay} == {"emulator-dense"}
    assert sorted(c.tags["step"] for c in replay) == sorted(c.tags["step"] for c in original)
    by_step = {c.tags["step"]: c for c in original}
    for call in replay:
        first = by_step[call.tags["step"]]
        assert call.tags == first.tags  # ticker and step
        body, first_body = await _body(recorded, call), await _body(recorded, first)
        assert body == with_model(first_body, "emulator-dense")  # byte for byte but the model's value
        assert {**json.loads(body), "model": "x"} == {**json.loads(first_body), "model": "x"}
        started, first_started = await _started(recorded, call.call_id), await _started(recorded, first.call_id)
        assert (started.method, started.path, started.stream) == (
            first_started.method,
            first_started.path,
            first_started.stream,
        )
        assert not any(name.lower() == "authorization" for name, _ in started.request_headers)
        # the gateway asked for usage of the streams that did not, as for the original
        assert call.usage_source == first.usage_source

    (row,) = await runs_report(recorded, run=f"{RUN}-replay-1")
    assert row.labels == {"replay_of": RUN}
    comparison = await compare_runs(recorded, [RUN, f"{RUN}-replay-1"])
    moe_run, dense_run = comparison.runs
    assert moe_run.server is not None and dense_run.server is not None
    assert moe_run.server.spec_decode_acceptance_rate is not None
    assert dense_run.server.spec_decode_acceptance_rate is not None
    # the profiles' MTP acceptance: ~50 % for the MoE, ~67 % for the dense model (DESIGN §7)
    assert dense_run.server.spec_decode_acceptance_rate > moe_run.server.spec_decode_acceptance_rate + 0.05
    assert dense_run.server.reconciled and moe_run.server.reconciled
    assert (dense_run.input_tokens, dense_run.calls) == (moe_run.input_tokens, moe_run.calls)
    assert any("kv_cache_size_tokens" in line for line in dense_run.differences)  # 64k vs 256k tokens of KV
    assert "kv_cache_size_tokens" in result.stdout  # the comparison it printed names the difference


async def test_limit_keeps_order_and_bytes(recorded: Database, moe: Process, backend_url: str, tmp_path: Path) -> None:
    result = _replay(
        backend_url, tmp_path, RUN, "--upstream", _url(moe), "--limit", "5", "--concurrency", "1", "--as", "again"
    )
    assert result.returncode == 0, result.stderr
    assert "replayed 5 requests" in result.stdout and "(1 at once)" in result.stdout
    original, replay = (await _calls(recorded, RUN))[:5], await _calls(recorded, "again")
    assert [c.tags for c in replay] == [c.tags for c in original]  # one at a time: the same order of start
    assert [c.request_blob for c in replay] == [c.request_blob for c in original]  # the same bytes, unmodified
    assert [c.model for c in replay] == [c.model for c in original]
    second = _replay(backend_url, tmp_path, RUN, "--upstream", _url(moe), "--limit", "1")
    assert second.returncode == 0, second.stderr
    assert f"as run {RUN}-replay-1 " in second.stdout  # `again` took no number; the next free name


async def test_redacted_and_imported_calls_are_skipped_and_counted(
    recorded: Database, moe: Process, backend_url: str, tmp_path: Path
) -> None:
    original = await _calls(recorded, RUN)
    for call in original[:2]:
        done = _ledger("redact", str(call.request_blob), "--reason", "test", "--db", backend_url)
        assert done.returncode == 0, done.stderr
    history = tmp_path / "history.jsonl"
    row = {"run": RUN, "ticker": "T9", "started_at": original[-1].started_at.isoformat(), "elapsed_s": 1.0}
    history.write_text(json.dumps({**row, "input_tokens": 10, "output_tokens": 5}) + "\n")
    imported = _ledger("import", str(history), "--db", backend_url)
    assert imported.returncode == 0, imported.stderr
    result = _replay(backend_url, tmp_path, RUN, "--upstream", _url(moe))
    assert result.returncode == 0, result.stderr
    # the skip says when and why the bodies went (their blob.redacted events)
    skipped = rf"3 of its {CALLS + 1} calls skipped \(2 request body redacted on \d{{4}}-\d\d-\d\d \(test\), 1 imported"
    assert re.search(skipped, result.stdout), result.stdout
    replay = await _calls(recorded, f"{RUN}-replay-1")
    assert sorted(c.tags["step"] for c in replay) == sorted(c.tags["step"] for c in original[2:])


async def test_a_run_whose_bodies_were_erased_is_refused_with_the_reason(
    recorded: Database, moe: Process, backend_url: str, tmp_path: Path
) -> None:
    erased = _ledger("redact", "--run", RUN, "--reason", "retention: 90 days", "--db", backend_url)
    assert erased.returncode == 0, erased.stderr
    result = _replay(backend_url, tmp_path, RUN, "--upstream", _url(moe))
    assert result.returncode == 2
    reason = rf"nothing to replay, {CALLS} of its {CALLS} calls skipped \({CALLS} request body redacted on "
    assert re.search(reason + r"\d{4}-\d\d-\d\d \(retention: 90 days\)\)", result.stderr), result.stderr
    assert [r.run for r in await runs_report(recorded)] == [RUN]  # nothing was recorded


async def test_bad_usage_exits_2(recorded: Database, moe: Process, backend_url: str, tmp_path: Path) -> None:
    unknown = _replay(backend_url, tmp_path, "no-such-run", "--upstream", _url(moe))
    assert unknown.returncode == 2 and "no run 'no-such-run'" in unknown.stderr
    taken = _replay(backend_url, tmp_path, RUN, "--upstream", _url(moe), "--as", RUN)
    assert taken.returncode == 2 and "already has calls" in taken.stderr
    assert _replay(backend_url, tmp_path, RUN, "--upstream", _url(moe), "--concurrency", "0").returncode == 2
    assert _replay(backend_url, tmp_path, RUN, "--upstream", "127.0.0.1:1").returncode == 2
    assert [r.run for r in await runs_report(recorded)] == [RUN]  # nothing was recorded


async def test_ctrl_c_stops_with_what_finished_recorded(recorded: Database, backend_url: str, tmp_path: Path) -> None:
    slow = processes.emulator(tmp_path, "--profile", "dense", speed=0.5).start()  # calls of ~1 s
    try:
        args = [RUN, "--upstream", _url(slow), "--model", "emulator-dense", "--concurrency", "2"]
        proc = await asyncio.create_subprocess_exec(
            LEDGER,
            "replay",
            *args,
            "--db",
            backend_url,
            "--spool-dir",
            str(tmp_path / "spool"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            for _ in range(600):  # until the first replayed call is recorded
                rows = await runs_report(recorded)
                if any(r.run == f"{RUN}-replay-1" and r.calls - r.incomplete_calls >= 1 for r in rows):
                    break
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    finally:
        slow.stop()
    stdout = out.decode()
    assert proc.returncode == 130, err.decode()
    assert "stopped: replayed" in stdout and "not sent" in stdout
    replay = await _calls(recorded, f"{RUN}-replay-1")
    assert 1 <= len(replay) < CALLS
    # every call that started has its final event: finished, or failed as the client left
    assert {(c.status, c.failure_reason) for c in replay} <= {("ok", None), ("failed", "client_disconnected")}
    verify = _ledger("verify", "--db", backend_url)
    assert verify.returncode == 0, verify.stdout


def test_with_model_changes_only_the_model_value() -> None:
    body = b'{ "messages": [{"role": "user", "content": "model \\" }"}],\n  "model" : "a",\t"n": {"model": "b"} }'
    assert with_model(body, "zé") == body.replace(b'"model" : "a"', '"model" : "zé"'.encode())
    assert with_model(b'{"stream":true}', "m") == b'{"model":"m","stream":true}'
    assert with_model(b"{}", "m") == b'{"model":"m"}'
    assert with_model(b"[1]", "m") is None and with_model(b"not json", "m") is None
    assert msgspec.json.decode(with_model(b'{"mod\\u0065l": 1, "x": [1, {"model": 2}]}', "m") or b"") == {
        "model": "m",
        "x": [1, {"model": 2}],
    }


def test_max_in_flight_from_starts_and_ends() -> None:
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    assert max_in_flight([]) == 1
    assert max_in_flight([(at(0), at(2)), (at(1), at(3)), (at(2), at(4))]) == 2  # an end at a start: no overlap
    assert max_in_flight([(at(0), at(5)), (at(1), at(2)), (at(1.5), None)]) == 3


# Upstreams a replay must not run against, on loopback ports.

_MODELS = b'{"object": "list", "data": [{"id": "emulator-moe", "object": "model"}]}'
_ANSWER = (
    b'{"id": "c", "object": "chat.completion", "model": "emulator-moe", "choices": [{"index": 0, "message": '
    b'{"role": "assistant", "content": "ok"}, "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}'
)
_ERROR = b'{"error": {"message": "overloaded", "type": "ServiceUnavailable", "param": null, "code": 503}}'


@contextlib.contextmanager
def _upstream(*, models: int, post: str) -> Iterator[str]:
    """An HTTP server: GET /v1/models answers `models` (200: a model list); a POST is answered
    "alternately" 200 and 503, "never" (held open until the test ends), or 200 until the server
    "dies after 3": the third answer is sent once the port is closed."""
    release = threading.Event()
    answers = itertools.cycle((200, 503))
    lock = threading.Lock()
    posts = itertools.count(1)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(models, _MODELS if models == 200 else b'{"detail": "Not Found"}')
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if post == "never":
                release.wait()
                return
            if post == "dies after 3":
                if next(posts) == 3:
                    server.shutdown()  # serve_forever runs in another thread
                    server.server_close()
                self._send(200, _ANSWER)
                return
            with lock:
                status = next(answers)
            self._send(status, _ANSWER if status == 200 else _ERROR)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _silent_port() -> Iterator[str]:
    """A port that completes TCP handshakes (the kernel's backlog) and never answers a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _event_count(database: Database) -> int:
    async with database.engine.connect() as conn:
        return len((await conn.execute(select(events.c.position))).all())


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.strip().splitlines()[-1]


async def test_an_upstream_that_cannot_serve_exits_2_having_recorded_nothing(
    recorded: Database, backend_url: str, tmp_path: Path
) -> None:
    before = await _event_count(recorded)
    dead = _replay(backend_url, tmp_path, RUN, "--upstream", f"http://127.0.0.1:{free_port()}")
    assert dead.returncode == 2, dead.stdout + dead.stderr
    assert "cannot reach it" in dead.stderr and "nothing was sent or recorded" in dead.stderr
    with _upstream(models=404, post="alternately") as wrong:
        refused = _replay(backend_url, tmp_path, RUN, "--upstream", wrong)
    assert refused.returncode == 2 and "GET /v1/models answered 404" in refused.stderr
    with _silent_port() as silent:  # never answers: the check is bounded by the deadline
        hung = _replay(backend_url, tmp_path, RUN, "--upstream", silent, "--deadline-s", "2")
    assert hung.returncode == 2 and "no answer to GET /v1/models within" in hung.stderr
    assert await _event_count(recorded) == before
    assert [r.run for r in await runs_report(recorded)] == [RUN]


async def test_the_deadline_stops_a_replay_whose_calls_never_answer(
    recorded: Database, backend_url: str, tmp_path: Path
) -> None:
    with _upstream(models=200, post="never") as stuck:
        result = _replay(backend_url, tmp_path, RUN, "--upstream", stuck, "--concurrency", "2", "--deadline-s", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    last = _last_line(result)
    assert last.startswith("deadline of 3 s reached: replayed 2 requests") and f"{CALLS - 2} not sent" in last
    assert last.endswith(f"2 of 2 calls failed (ledger export --run {RUN}-replay-1 --status error,failed)")
    replay = await _calls(recorded, f"{RUN}-replay-1")
    assert [(c.status, c.failure_reason) for c in replay] == [("failed", "client_disconnected")] * 2


async def test_a_silent_call_fails_after_the_call_timeout(recorded: Database, backend_url: str, tmp_path: Path) -> None:
    with _upstream(models=200, post="never") as stuck:
        args = ["--upstream", stuck, "--limit", "2", "--concurrency", "2", "--call-timeout-s", "1"]
        result = _replay(backend_url, tmp_path, RUN, *args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 answered 2xx, 2 with an error status; 2 of 2 calls failed" in _last_line(result)
    replay = await _calls(recorded, f"{RUN}-replay-1")
    assert [(c.status, c.failure_reason) for c in replay] == [("failed", "upstream_timeout")] * 2


async def test_failed_calls_exit_1_and_are_counted_last(recorded: Database, backend_url: str, tmp_path: Path) -> None:
    with _upstream(models=200, post="alternately") as flaky:  # 200, 503, 200, 503
        result = _replay(backend_url, tmp_path, RUN, "--upstream", flaky, "--limit", "4", "--concurrency", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 answered 2xx, 2 with an error status; 2 of 4 calls failed" in _last_line(result)
    assert [c.status for c in await _calls(recorded, f"{RUN}-replay-1")] == ["ok", "error", "ok", "error"]


async def test_a_model_the_upstream_does_not_serve_is_refused_before_sending(
    recorded: Database, dense: Process, backend_url: str, tmp_path: Path
) -> None:
    before = await _event_count(recorded)
    result = _replay(backend_url, tmp_path, RUN, "--upstream", _url(dense))  # serves emulator-dense only
    assert result.returncode == 2, result.stdout + result.stderr
    assert "serves 'emulator-dense', not 'emulator-moe'" in result.stderr
    assert "--model emulator-dense" in result.stderr and "nothing was sent or recorded" in result.stderr
    assert await _event_count(recorded) == before
    # named explicitly, a name is sent as given (a proxy may route names it does not list)
    with _upstream(models=200, post="alternately") as lists_moe:
        sent = _replay(backend_url, tmp_path, RUN, "--upstream", lists_moe, "--model", "unlisted", "--limit", "1")
    assert sent.returncode == 0, sent.stdout + sent.stderr


async def test_an_upstream_that_dies_mid_replay_stops_it_after_a_few_unreachable_calls(
    recorded: Database, backend_url: str, tmp_path: Path
) -> None:
    with _upstream(models=200, post="dies after 3") as dying:
        result = _replay(backend_url, tmp_path, RUN, "--upstream", dying, "--concurrency", "1")
        last = _last_line(result)
        assert result.returncode == 1, result.stdout + result.stderr
        assert last.startswith(f"stopped, {dying} unreachable for 5 calls in a row: replayed 8 requests"), last
    assert f"3 answered 2xx, 5 with an error status, {CALLS - 8} not sent; 5 of 8 calls failed" in last
    replay = await _calls(recorded, f"{RUN}-replay-1")
    assert [(c.status, c.failure_reason) for c in replay] == [("ok", None)] * 3 + [
        ("failed", "upstream_unreachable")
    ] * 5
