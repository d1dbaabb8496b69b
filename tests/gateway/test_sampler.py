"""The server sampler against a scripted upstream: samples, run boundaries, and every way /metrics can fail."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from usage_ledger.gateway import sampler as sampler_module
from usage_ledger.gateway.sampler import ServerSampler
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.events import NewEvent, ServerSampled

METRICS = (Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0" / "spec_decode" / "metrics.txt").read_text()
MODELS = b'{"object":"list","data":[{"id":"tiny","object":"model","root":"/models/tiny","max_model_len":1024}]}'


class Upstream:
    """Answers GET /metrics from `script` (one entry per request, the last repeats): a body, a
    status, or a delay in seconds before the body; /v1/models with MODELS."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.metrics_requests = 0
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://user:secret@127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.connections:
            writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1]
                status, body = 200, MODELS
                if path == b"/metrics":
                    step = self.script[min(self.metrics_requests, len(self.script) - 1)]
                    self.metrics_requests += 1
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                        step = METRICS
                    status, body = (step, b"") if isinstance(step, int) else (200, step.encode())
                writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
                await writer.drain()
        writer.close()


class Writer:
    def __init__(self) -> None:
        self.events: list[NewEvent] = []

    def submit(self, events: list[NewEvent], bodies: object) -> asyncio.Future[None]:
        self.events += events
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    def samples(self) -> list[ServerSampled]:
        return [e.body for e in self.events if isinstance(e.body, ServerSampled)]


@contextlib.asynccontextmanager
async def sampling(
    url: str, interval_s: float = 0.05, timeout_s: float = 2.0
) -> AsyncIterator[tuple[ServerSampler, Writer]]:
    writer = Writer()
    sampler = ServerSampler(
        GatewaySettings(upstream=url, server_sample_s=interval_s, server_sample_timeout_s=timeout_s),
        writer,  # type: ignore[arg-type]
    )
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler, writer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - polling what the sampler wrote
            await asyncio.sleep(0.01)


async def test_samples_carry_the_counters_config_and_models_once() -> None:
    async with Upstream([METRICS]) as url, sampling(url) as (_, writer):
        await until(lambda: len(writer.samples()) >= 3)
    first, second = writer.samples()[:2]
    assert first.trigger == "start" and second.trigger == "interval"
    assert first.upstream.startswith("http://127.0.0.1:") and "secret" not in first.upstream
    assert first.counters["vllm:spec_decode_num_accepted_tokens_total"] == 97.0
    assert first.accepted_per_pos == [35.0, 31.0, 31.0]
    assert first.config is not None and first.config["block_size"] == "128"
    assert first.models is not None and first.models[0].id == "tiny" and first.models[0].max_model_len == 1024
    assert second.config is None and second.models is None  # unchanged: not repeated
    assert all(e.stream == "server" for e in writer.events)


async def test_a_run_gets_a_sample_at_its_first_call_and_after_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "RUN_END_DELAY_S", 0.05)
    async with Upstream([METRICS]) as url, sampling(url, interval_s=3600) as (sampler, writer):
        await until(lambda: len(writer.samples()) == 1)  # the start sample
        sampler.call_started("a", "nightly")
        sampler.call_started("b", "nightly")
        sampler.call_started("x", None)  # untagged: no boundary
        await until(lambda: len(writer.samples()) == 2)
        sampler.call_ended("a")
        await asyncio.sleep(0.2)
        assert len(writer.samples()) == 2  # "b" is still in flight
        sampler.call_ended("b")
        await until(lambda: len(writer.samples()) == 3)
        sampler.call_started("c", "nightly")  # the same run again: no second run_start
        sampler.call_ended("c")
        await until(lambda: len(writer.samples()) == 4)
    assert [(s.trigger, s.run) for s in writer.samples()] == [
        ("start", None),
        ("run_start", "nightly"),
        ("run_end", "nightly"),
        ("run_end", "nightly"),
    ]


async def test_garbage_errors_and_slowness_cost_a_warning_and_sampling_goes_on() -> None:
    script: list[Any] = ["<html>oops</html>", "<html>oops</html>", 500, 1.0, METRICS]
    with structlog.testing.capture_logs() as logs:
        async with Upstream(script) as url, sampling(url, interval_s=0.01, timeout_s=0.2) as (_, writer):
            await until(lambda: len(writer.samples()) >= 1)
    assert writer.samples()[0].counters["vllm:request_success_total"] == 19.0
    said = [(entry["event"], entry.get("error", "").split(":")[0]) for entry in logs if "sampl" in entry["event"]]
    assert said == [  # once per new problem, not once per attempt
        ("server_sample_failed", "MetricsUnreadable"),
        ("server_sample_failed", "MetricsUnreadable"),
        ("server_sample_failed", "ReadTimeout"),
        ("server_sampling_resumed", ""),
    ]
    assert [e["log_level"] for e in logs if e["event"] == "server_sample_failed"] == ["warning"] * 3


async def test_an_upstream_without_metrics_turns_sampling_off() -> None:
    upstream = Upstream([404])
    async with upstream as url:
        writer = Writer()
        sampler = ServerSampler(GatewaySettings(upstream=url, server_sample_s=0.01), writer)  # type: ignore[arg-type]
        async with asyncio.timeout(5):
            await sampler.run()  # returns by itself
    assert writer.events == [] and upstream.metrics_requests == 1


async def test_zero_interval_is_off() -> None:
    writer = Writer()
    sampler = ServerSampler(GatewaySettings(server_sample_s=0), writer)  # type: ignore[arg-type]
    await sampler.run()
    sampler.call_started("a", "r")
    sampler.call_ended("a")
    assert writer.events == []
