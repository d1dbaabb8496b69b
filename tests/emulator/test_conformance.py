"""Wire-format conformance against the real `openai` SDK on a loopback port."""

from __future__ import annotations

import httpx
import msgspec
import openai
import pytest

from usage_ledger.emulator import profile_config, running_emulator
from usage_ledger.emulator.tokenizer import count_tokens, render_chat

MODEL = "emulator-moe"
FAST = profile_config("moe", speed=1000.0)


@pytest.fixture
async def emu():  # type: ignore[no-untyped-def]
    async with running_emulator(FAST) as running:
        yield running


@pytest.fixture
async def client(emu):  # type: ignore[no-untyped-def]
    async with openai.AsyncOpenAI(base_url=emu.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _chat_prompt_tokens(content: str) -> int:
    return count_tokens(render_chat([("user", content)]))


async def test_chat_non_stream(client: openai.AsyncOpenAI) -> None:
    content = "abcd" * 50
    resp = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=17, extra_body={"min_tokens": 17}
    )
    assert resp.id.startswith("chatcmpl-")
    assert resp.object == "chat.completion"
    assert resp.model == MODEL
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 17 == count_tokens(choice.message.content or "")
    assert resp.usage.prompt_tokens == _chat_prompt_tokens(content)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 17


async def test_chat_stream_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=40,
        extra_body={"min_tokens": 40},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 40
    content_chunks = chunks[1:-1]
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert count_tokens(text) == 40
    assert content_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content_chunks[:-1])
    assert all(c.usage is None for c in content_chunks)
    # MTP: 1 + accepted draft tokens per step, so fewer chunks than tokens
    assert 1 <= len(content_chunks) <= 40
    assert len({c.id for c in chunks}) == 1


async def test_stream_without_include_usage_has_no_usage_chunk(emu) -> None:  # type: ignore[no-untyped-def]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": True}
    async with httpx.AsyncClient() as h:
        r = await h.post(emu.base_url + "/v1/chat/completions", json=body)
    events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    parsed = [msgspec.json.decode(e) for e in events[:-1]]
    assert all(p["choices"] for p in parsed)
    assert all("usage" not in p for p in parsed)
    assert r.text.endswith("data: [DONE]\n\n")


async def test_continuous_usage_stats(emu) -> None:  # type: ignore[no-untyped-def]
    body = {
        "prompt": "abcd" * 8,
        "max_tokens": 12,
        "min_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with httpx.AsyncClient() as h:
        r = await h.post(emu.base_url + "/v1/completions", json=body)
    events = [msgspec.json.decode(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
    completions = [e["usage"]["completion_tokens"] for e in events]
    assert completions == sorted(completions)
    assert completions[-1] == completions[-2] == 12
    assert all(e["usage"]["prompt_tokens"] == 8 for e in events)
    assert events[-1]["choices"] == []


async def test_completions_non_stream_and_request_id(client: openai.AsyncOpenAI) -> None:
    raw = await client.completions.with_raw_response.create(
        model=MODEL, prompt="abcd" * 10, max_tokens=3, extra_headers={"X-Request-Id": "req-42"}
    )
    resp = raw.parse()
    assert raw.headers["x-request-id"] == "req-42"
    assert resp.id == "cmpl-req-42"
    assert resp.object == "text_completion"
    assert resp.usage is not None and resp.usage.prompt_tokens == 10
    assert count_tokens(resp.choices[0].text) == 3


async def test_request_id_on_chat(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, extra_headers={"X-Request-Id": "abc"}
    )
    assert resp.id == "chatcmpl-abc"


async def test_natural_length_is_deterministic_and_stops(client: openai.AsyncOpenAI) -> None:
    # No max_tokens: a length drawn from the prompt, finish "stop"; same prompt, same length.
    async def once() -> int:
        r = await client.completions.create(model=MODEL, prompt="same prompt", stream=False)
        assert r.choices[0].finish_reason == "stop"
        assert r.usage is not None
        return r.usage.completion_tokens

    first = await once()
    assert first == await once()
    assert 1470 * 0.5 <= first <= 1470 * 1.5


async def test_ignore_eos_and_vllm_extras_accepted(client: openai.AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=9,
        extra_body={
            "ignore_eos": True,
            "top_k": 20,
            "min_p": 0.0,
            "chat_template_kwargs": {"enable_thinking": False},
            "priority": 0,
            "some_unknown_field": [1, 2],
        },
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 9


async def test_unknown_model_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == 404 and body["type"] == "NotFoundError" and "nope" in body["message"]


async def test_prompt_too_long_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=MODEL, prompt="abcd" * (FAST.max_model_len + 1), max_tokens=1)
    assert "maximum context length" in str(info.value)


async def test_stream_options_without_stream_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="stream"):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], stream_options={"include_usage": True}
        )


async def test_wrong_content_type_400(emu) -> None:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient() as h:
        r = await h.post(emu.base_url + "/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400


async def test_models_health_version_tokenize(client: openai.AsyncOpenAI, emu) -> None:  # type: ignore[no-untyped-def]
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra is not None
    assert models.data[0].model_extra["max_model_len"] == FAST.max_model_len
    async with httpx.AsyncClient(base_url=emu.base_url) as h:
        assert (await h.get("/health")).status_code == 200
        assert "version" in (await h.get("/version")).json()
        tok = (await h.post("/tokenize", json={"prompt": "héllo world!"})).json()
        assert tok["count"] == len(tok["tokens"]) == count_tokens("héllo world!")
        back = (await h.post("/detokenize", json={"tokens": tok["tokens"]})).json()
        assert back["prompt"] == "héllo world!"
        chat_tok = (await h.post("/tokenize", json={"messages": [{"role": "user", "content": "hi there"}]})).json()
        resp = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi there"}], max_tokens=1
        )
        assert resp.usage is not None and chat_tok["count"] == resp.usage.prompt_tokens
