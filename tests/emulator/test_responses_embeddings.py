"""`POST /v1/responses` and `POST /v1/embeddings` (vLLM 0.32's shapes; see emulator.responses/.embeddings)."""

from __future__ import annotations

import base64
import struct

import httpx
import openai
import pytest

from tests.emulator.shapes import parse_sse
from usage_ledger.emulator import profile_config, running_emulator
from usage_ledger.emulator.tokenizer import count_tokens, render_chat

FAST = profile_config("moe", speed=1000.0)
MODEL = FAST.model
POOLING = profile_config("moe", speed=1000.0, runner="pooling")
STREAM_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


async def test_responses_non_stream_usage_and_status() -> None:
    async with running_emulator(FAST) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        body = {"model": MODEL, "input": "hello there", "instructions": "be brief", "max_output_tokens": 7}
        r = await h.post("/v1/responses", json={**body, "ignore_eos": True})
    resp = r.json()
    assert r.status_code == 200 and resp["object"] == "response" and resp["id"].startswith("resp_")
    usage = resp["usage"]
    assert usage["output_tokens"] == 7
    assert usage["input_tokens"] == count_tokens(render_chat([("system", "be brief"), ("user", "hello there")]))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert set(usage["input_tokens_details"]) == {
        "cached_tokens",
        "cache_write_tokens",
        "input_tokens_per_turn",
        "cached_tokens_per_turn",
    }
    assert set(usage["output_tokens_details"]) == {
        "reasoning_tokens",
        "tool_output_tokens",
        "output_tokens_per_turn",
        "tool_output_tokens_per_turn",
    }
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = resp["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["phase"] is None
    assert count_tokens(message["content"][0]["text"]) == 7
    assert "metrics" not in resp  # left out unless --enable-per-request-metrics


async def test_responses_stream_events_and_final_usage() -> None:
    cfg = profile_config("moe", speed=1000.0, enable_per_request_metrics=True)
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "stream": True}
        r = await h.post("/v1/responses", json={**body, "max_output_tokens": 30})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    names = [e.name for e in events]
    collapsed = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert collapsed == STREAM_EVENTS  # no `data: [DONE]` in the Responses API
    assert all(e.data["type"] == e.name for e in events)
    assert [e.data["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e.data["delta"] for e in events if e.name == "response.output_text.delta")
    final = events[-1].data["response"]
    assert events[0].data["response"]["usage"] is None and events[0].data["response"]["status"] == "in_progress"
    assert final["output"][0]["content"][0]["text"] == deltas
    assert final["usage"]["output_tokens"] == count_tokens(deltas)
    assert final["metrics"]["speculative_decoding"] is None  # timing only, nulls kept in the response


async def test_responses_with_the_openai_sdk() -> None:
    async with (
        running_emulator(FAST) as emu,
        openai.AsyncOpenAI(base_url=emu.base_url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        resp = await client.responses.create(model=MODEL, input="hello", max_output_tokens=5)
        assert resp.usage is not None and resp.usage.output_tokens <= 5
        assert resp.output_text
        stream = await client.responses.create(model=MODEL, input="hello", max_output_tokens=5, stream=True)
        kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"


async def test_embeddings_usage_vectors_and_counters() -> None:
    cfg = profile_config("moe", speed=1000.0, embedding_dim=8, runner="pooling")
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        r = await h.post("/v1/embeddings", json={"model": MODEL, "input": ["abcdabcd", "abcd"]})
        again = await h.post("/v1/embeddings", json={"input": "abcdabcd", "encoding_format": "base64", "dimensions": 4})
        metrics = (await h.get("/metrics")).text
    body = r.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 3,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    vector = body["data"][0]["embedding"]
    assert len(vector) == 8 and sum(v * v for v in vector) == pytest.approx(1.0)
    packed = base64.b64decode(again.json()["data"][0]["embedding"])
    assert len(struct.unpack("<4f", packed)) == 4
    # each input is one pooling request: prompt tokens and successes counted, no generation
    assert 'vllm:prompt_tokens_total{engine="0",model_name="emulator-moe"} 5.0' in metrics
    assert 'vllm:generation_tokens_total{engine="0",model_name="emulator-moe"} 0.0' in metrics
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="emulator-moe"} 3.0' in metrics


async def test_embeddings_with_the_openai_sdk_and_errors() -> None:
    async with (
        running_emulator(POOLING) as emu,
        openai.AsyncOpenAI(base_url=emu.base_url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        resp = await client.embeddings.create(model=MODEL, input="hello world")  # the SDK asks for base64
        assert len(resp.data[0].embedding) == POOLING.embedding_dim
        assert resp.usage.prompt_tokens == resp.usage.total_tokens == count_tokens("hello world")
        with pytest.raises(openai.BadRequestError):
            await client.embeddings.create(model=MODEL, input=[])
        with pytest.raises(openai.NotFoundError):
            await client.embeddings.create(model="nope", input="x")


async def test_a_server_runs_one_kind_of_model() -> None:
    # as in vLLM: a generate server has no /v1/embeddings, a pooling one no chat/completions/responses
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    async with running_emulator(FAST) as emu, httpx.AsyncClient(base_url=emu.base_url) as h:
        r = await h.post("/v1/embeddings", json={"input": "x"})
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
        assert (await h.post("/v1/chat/completions", json=chat)).status_code == 200
    async with running_emulator(POOLING) as emu, httpx.AsyncClient(base_url=emu.base_url) as h:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
            assert (await h.post(path, json=chat)).status_code == 404
        assert (await h.post("/v1/embeddings", json={"input": "x"})).status_code == 200
