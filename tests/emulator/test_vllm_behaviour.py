"""vLLM 0.32 behaviour the recorded transcripts showed: n > 1, clamping, stop reasons, logprobs, errors."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from tests.emulator.shapes import parse_sse
from usage_ledger.emulator import profile_config, running_emulator
from usage_ledger.emulator.tokenizer import count_tokens

FAST = profile_config("moe", speed=1000.0)
CHAT = "/v1/chat/completions"


def _metric(text: str, name: str, **labels: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items())
    )


async def _post(path: str, body: dict[str, Any], cfg: Any = FAST) -> httpx.Response:
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        return await h.post(path, json=body)


async def test_n_choices_are_n_engine_requests() -> None:
    body = {"prompt": "abcd" * 5, "max_tokens": 6, "min_tokens": 6, "n": 3, "temperature": 0.8}
    cfg = profile_config("moe", speed=1000.0, enable_per_request_metrics=True)
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        r = (await h.post("/v1/completions", json=body)).json()
        metrics = (await h.get("/metrics")).text
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"] == {**r["usage"], "prompt_tokens": 5, "completion_tokens": 18, "total_tokens": 23}
    assert r["metrics"] is None  # vLLM cannot attribute per-request metrics to one of n streams
    # the server counts each choice as a request with the whole prompt (reconciliation must know)
    assert _metric(metrics, "vllm:request_success_total", finished_reason="length") == 3
    assert _metric(metrics, "vllm:prompt_tokens_total") == 15
    assert _metric(metrics, "vllm:generation_tokens_total") == 18


async def test_n_choices_stream_interleaved_with_one_usage_chunk() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "min_tokens": 5, "n": 2}
    text = (await _post(CHAT, {**body, "stream": True, "stream_options": {"include_usage": True}})).text
    events = [e.data for e in parse_sse(text)]
    assert [e["choices"][0]["delta"].get("role") for e in events[:2]] == ["assistant", "assistant"]
    assert [e["choices"][0]["index"] for e in events[:2]] == [0, 1]
    finishes = [e["choices"][0]["index"] for e in events[2:-2] if e["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1]
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 10
    assert events[-1] == "[DONE]"


async def test_greedy_n_is_refused_as_vllm_does() -> None:
    r = await _post(CHAT, {"messages": [{"role": "user", "content": "x"}], "n": 2, "temperature": 0})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "n must be 1 when using greedy sampling, got 2.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


async def test_max_tokens_is_clamped_to_the_context_and_a_long_prompt_refused() -> None:
    cfg = profile_config("moe", speed=1000.0, max_model_len=64)
    r = await _post("/v1/completions", {"prompt": "abcd" * 60, "max_tokens": 50}, cfg)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = await _post("/v1/completions", {"prompt": "abcd" * 65, "max_tokens": 1}, cfg)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_tokens"
    assert "maximum context length is 64 tokens" in r.json()["error"]["message"]


async def test_stop_string_is_the_stop_reason_and_hides_spec_metrics() -> None:
    spec_only = profile_config(
        "moe", speed=1000.0, mean_output_tokens=5, output_spread=0.0, per_request_spec_decode_metrics="summary"
    )
    cfg = msgspec.structs.replace(spec_only, enable_per_request_metrics=True)
    stopped = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 30, "stop": ["\n"]}
    r = (await _post(CHAT, stopped, cfg)).json()
    assert (r["choices"][0]["finish_reason"], r["choices"][0]["stop_reason"]) == ("stop", "\n")
    assert r["metrics"]["speculative_decoding"] is None  # vLLM's detokenizer ended it, not the engine
    assert (await _post(CHAT, stopped, spec_only)).json()["metrics"] is None  # so no block at all
    r = (
        await _post(
            CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 30, "stop_token_ids": [7]}, cfg
        )
    ).json()
    assert r["choices"][0]["stop_reason"] == 7 and r["metrics"]["speculative_decoding"] is not None
    r = (await _post(CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 30}, cfg)).json()
    assert r["choices"][0]["stop_reason"] is None  # EOS


async def test_logprobs_layouts() -> None:
    chat = (await _post(CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "min_tokens": 4,
                               "logprobs": True, "top_logprobs": 2})).json()  # fmt: skip
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert "".join(c["token"] for c in content) == chat["choices"][0]["message"]["content"]
    prompt = "abcdefgh"
    echo = (await _post("/v1/completions", {"prompt": prompt, "max_tokens": 3, "min_tokens": 3, "logprobs": 1,
                                            "echo": True})).json()["choices"][0]  # fmt: skip
    assert echo["text"].startswith(prompt) and count_tokens(echo["text"]) == 2 + 3
    lp = echo["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and len(lp["tokens"]) == 5
    assert lp["text_offset"] == [0, 4, 8, 12, 16]
    assert echo["prompt_logprobs"][0] is None and len(echo["prompt_logprobs"]) == 2
    stream = (await _post("/v1/completions", {"prompt": "x", "max_tokens": 6, "min_tokens": 6, "logprobs": 0,
                                              "stream": True})).text  # fmt: skip
    chunks = [e.data for e in parse_sse(stream) if isinstance(e.data, dict)]
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 4, 8, 12, 16, 20]  # continuing across chunks


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b'{"messages": [{"role": "user", "content": "unterminated', "body.56"),
        (b'{"messages": [{"role": 1}]}', "body.messages.0.role"),
        (b"{}", "body.messages"),
    ],
)
async def test_bodies_that_do_not_validate_get_fastapis_error(content: bytes, param: str) -> None:
    async with running_emulator(FAST) as emu, httpx.AsyncClient() as h:
        r = await h.post(emu.base_url + CHAT, content=content, headers={"content-type": "application/json"})
    error = r.json()["error"]
    assert (r.status_code, error["type"], error["code"]) == (400, "Bad Request", 400)
    assert error["param"].startswith("body")
    if not param.startswith("body.5"):
        assert error["param"] == param
