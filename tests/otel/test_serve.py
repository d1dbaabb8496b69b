"""End to end: `ledger serve` with LEDGER_OTEL_EXPORT=1 in front of the emulator, the `openai` SDK as client."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway import processes
from tests.otel.receiver import attrs, running_receiver


async def test_serve_exports_spans_of_its_calls(backend_url: str, tmp_path: Path) -> None:
    emulator = processes.emulator(tmp_path).start()
    try:
        with running_receiver() as receiver:
            processes.upgrade(backend_url)
            env = {"LEDGER_OTEL_EXPORT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "e2e"}
            gateway = processes.gateway(tmp_path, emulator.url, backend_url, env=env).start()  # type: ignore[attr-defined]
            try:
                client = openai.AsyncOpenAI(
                    base_url=gateway.url + "/v1",  # type: ignore[attr-defined]
                    api_key="sk-e2e",
                    default_headers={"X-Ledger-Run": "otel-e2e"},
                    max_retries=0,
                )
                messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
                try:
                    await client.chat.completions.create(model="emulator-moe", messages=messages, max_tokens=8)
                    stream = await client.chat.completions.create(
                        model="emulator-moe", messages=messages, max_tokens=8, stream=True
                    )
                    async for _ in stream:
                        pass
                finally:
                    await client.close()
                deadline = time.monotonic() + 30
                while len(receiver.spans()) < 2 and time.monotonic() < deadline:  # noqa: ASYNC110 (another thread fills it)
                    await asyncio.sleep(0.2)
            finally:
                gateway.stop()
    finally:
        emulator.stop()
    spans = receiver.spans()
    assert len(spans) == 2
    for span in spans:
        a = attrs(span)
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "emulator-moe"  # the body's, streamed or not
        assert a["usage_ledger.run"] == "otel-e2e"
        assert a["gen_ai.usage.output_tokens"] > 0
        assert span.end_time_unix_nano > span.start_time_unix_nano
