"""Reading usage from responses: every inference API's shape, and no other field's shape can cost it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from usage_ledger.gateway.usage import TOKEN_CHUNK, inspect_chunk, inspect_response, read_usage
from usage_ledger.ledger.events import Usage

CHAT_USAGE = {"prompt_tokens": 12, "total_tokens": 42, "completion_tokens": 30, "prompt_tokens_details": None}
CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi", "tool_calls": []},
            "logprobs": None,
            "finish_reason": "length",
        }
    ],
    "usage": CHAT_USAGE,
    "prompt_logprobs": None,
    "kv_transfer_params": None,
}
# vLLM --enable-per-request-metrics with speculative decoding: the block holds an object (and nulls)
METRICS = {
    "queued_time": 0.001,
    "prefill_time": 0.02,
    "decode_time": 0.3,
    "inference_time": 0.32,
    "speculative_decoding": {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 14},
}
RESPONSES = {
    "id": "resp_1",
    "object": "response",
    "status": "incomplete",
    "incomplete_details": {"reason": "max_output_tokens"},
    "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
    "usage": {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 16,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 25,
    },
}
EMBEDDINGS = {
    "id": "embd-1",
    "object": "list",
    "data": [{"index": 0, "object": "embedding", "embedding": [0.1, -0.2]}],
    "usage": {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0, "prompt_tokens_details": None},
}


def _b(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_chat_body() -> None:
    info = inspect_response(_b(CHAT))
    assert info.usage == Usage(prompt_tokens=12, completion_tokens=30, total_tokens=42)
    assert info.finish_reasons == ("length",) and info.request_id == "chatcmpl-1" and info.metrics is None
    assert info.finish_choices == (0,)


def test_a_metrics_block_with_objects_and_nulls_keeps_the_usage_and_is_kept_whole() -> None:
    for spec in (None, METRICS["speculative_decoding"]):
        info = inspect_response(_b({**CHAT, "metrics": {**METRICS, "speculative_decoding": spec}}))
        assert info.usage is not None and info.usage.completion_tokens == 30
        assert info.metrics == {**METRICS, "speculative_decoding": spec}


def test_responses_api_body() -> None:
    info = inspect_response(_b(RESPONSES))
    assert info.usage == Usage(prompt_tokens=9, completion_tokens=16, total_tokens=25, cached_tokens=0)
    assert info.finish_reasons == ("max_output_tokens",) and info.finish_choices == (0,)


def test_embeddings_body() -> None:
    usage = inspect_response(_b(EMBEDDINGS)).usage
    assert usage == Usage(prompt_tokens=7, completion_tokens=0, total_tokens=7)
    no_completion = {**EMBEDDINGS, "usage": {"prompt_tokens": 7, "total_tokens": 7}}
    assert inspect_response(_b(no_completion)).usage == usage


@pytest.mark.parametrize(
    ("usage", "problem"),
    [
        ({"prompt_tokens": "12", "completion_tokens": 3}, "prompt_tokens"),
        ({"prompt_tokens": 12, "completion_tokens": -1}, "completion_tokens"),
        ({"completion_tokens": 3}, "prompt_tokens"),
        ([1, 2], "list"),
        ({"prompt_tokens": True, "completion_tokens": 1}, "prompt_tokens"),
    ],
)
def test_usage_the_gateway_cannot_read_is_a_problem_not_an_absence(usage: Any, problem: str) -> None:
    info = inspect_response(_b({**CHAT, "usage": usage}))
    assert info.usage is None and problem in info.usage_problem


def test_null_or_missing_usage_is_absent() -> None:
    assert read_usage(msgspec.Raw(b"null")) == (None, "")
    assert read_usage(msgspec.Raw()) == (None, "")
    body = {k: v for k, v in CHAT.items() if k != "usage"}
    info = inspect_response(_b(body))
    assert info.usage is None and info.usage_problem == ""


def test_cached_tokens_from_either_api() -> None:
    usage = {**CHAT_USAGE, "prompt_tokens_details": {"cached_tokens": 8}}
    assert read_usage(msgspec.Raw(_b(usage)))[0] == Usage(
        prompt_tokens=12, completion_tokens=30, total_tokens=42, cached_tokens=8
    )
    odd = {**CHAT_USAGE, "prompt_tokens_details": [8]}
    assert read_usage(msgspec.Raw(_b(odd)))[0] == Usage(prompt_tokens=12, completion_tokens=30, total_tokens=42)


# -- chunks ----------------------------------------------------------------------------------------

CONTENT = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}}]}


def test_a_plain_token_chunk_is_the_shared_object() -> None:
    assert inspect_chunk(_b(CONTENT)) is TOKEN_CHUNK
    assert inspect_chunk(_b({**CONTENT, "usage": None})) is TOKEN_CHUNK


def test_the_usage_only_chunk_is_final() -> None:
    info = inspect_chunk(_b({"id": "c", "choices": [], "usage": CHAT_USAGE}))
    assert info.usage_only and info.usage_final and not info.per_choice_usage
    assert info.usage is not None and info.usage.total_tokens == 42


def test_per_choice_usage_is_not_final() -> None:
    info = inspect_chunk(_b({**CONTENT, "usage": CHAT_USAGE}))
    assert info.per_choice_usage and not info.usage_final and not info.usage_only and info.tokens == 1


def test_n_choices_count_each_delta_and_finish_reason() -> None:
    choices = [
        {"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"},
        {"index": 1, "delta": {"content": "b"}, "finish_reason": None},
    ]
    info = inspect_chunk(_b({"choices": choices}))
    assert info.tokens == 2 and info.finish_reasons == ("stop",) and info.finish_choices == (0,)
    later = inspect_chunk(_b({"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]}))
    assert later.finish_reasons == ("length",) and later.finish_choices == (1,)


def test_a_chunk_with_odd_members_still_gives_its_usage_and_metrics() -> None:
    odd = {"choices": "not a list", "usage": CHAT_USAGE, "metrics": METRICS, "error": None, "type": 3}
    info = inspect_chunk(_b(odd))
    assert info.usage is not None and info.usage.prompt_tokens == 12 and info.metrics == METRICS


def test_responses_stream_events() -> None:
    delta = {"type": "response.output_text.delta", "sequence_number": 3, "delta": "hi", "item_id": "m"}
    assert inspect_chunk(_b(delta)).tokens == 1
    created = {"type": "response.created", "response": {**RESPONSES, "status": "in_progress", "usage": None}}
    info = inspect_chunk(_b(created))
    assert info.usage is None and not info.terminal
    done = inspect_chunk(_b({"type": "response.completed", "sequence_number": 9, "response": RESPONSES}))
    assert done.terminal and done.usage_final and done.usage is not None and done.usage.completion_tokens == 16
    assert inspect_chunk(_b({"type": "error", "message": "boom"})).error


def test_python_json_dialect_still_gives_the_usage() -> None:
    body = json.dumps({**CHAT, "choices": [{"logprobs": {"content": [{"logprob": float("-inf")}]}}]}).encode()
    assert b"-Infinity" in body
    assert inspect_response(body).usage == Usage(prompt_tokens=12, completion_tokens=30, total_tokens=42)
    chunk = json.dumps({"choices": [], "usage": CHAT_USAGE, "x": float("nan")}).encode()
    assert inspect_chunk(chunk).usage_final


def test_numbers_out_of_range_cost_nothing_else() -> None:
    body = (
        _b({**CHAT, "metrics": {"x": 1}})
        .replace(b'"x": 1', b'"x": 1e999999')
        .replace(b'"created": 1', b'"created": 1e400')
    )
    info = inspect_response(body)
    assert info.usage is not None and info.usage.completion_tokens == 30 and info.metrics is None
    chunk = _b({"choices": [], "usage": CHAT_USAGE, "metrics": {"x": 1}}).replace(b'"x": 1', b'"x": 1e999999')
    assert inspect_chunk(chunk).usage is not None


def test_stream_error_chunk() -> None:
    assert inspect_chunk(_b({"error": {"message": "x", "code": 500}})).error
    assert not inspect_chunk(_b({**CONTENT, "error": None})).error


# -- property: no other member's shape can cost the usage --------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _mutate(obj: Any, data: st.DataObject, depth: int = 0) -> Any:
    """Add unknown members of any JSON type at every level, and replace known ones (not `usage`)."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key != "usage" and data.draw(st.integers(0, 4), label=f"replace {key}") == 0:
                out[key] = data.draw(_json, label=f"value of {key}")
            else:
                out[key] = _mutate(value, data, depth + 1) if key != "usage" else value
        for _ in range(data.draw(st.integers(0, 2), label="extra members")):
            name = data.draw(st.text(max_size=8).filter(lambda k: k not in obj and k != "usage"), label="name")
            out[name] = data.draw(_json, label="extra value")
        return out
    if isinstance(obj, list):
        return [_mutate(item, data, depth + 1) for item in obj]
    return obj


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([CHAT, {**CHAT, "metrics": METRICS}, RESPONSES, EMBEDDINGS]), st.data())
def test_usage_survives_any_mutation_of_the_rest_of_a_body(body: dict[str, Any], data: st.DataObject) -> None:
    expected = inspect_response(_b(body)).usage
    mutated = _mutate(body, data)
    assert inspect_response(_b(mutated)).usage == expected


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        [
            {"id": "c", "choices": [], "usage": CHAT_USAGE},
            {**CONTENT, "usage": CHAT_USAGE, "metrics": METRICS},
            {"type": "response.completed", "response": RESPONSES},
        ]
    ),
    st.data(),
)
def test_chunk_usage_survives_any_mutation_of_the_rest(chunk: dict[str, Any], data: st.DataObject) -> None:
    expected = inspect_chunk(_b(chunk)).usage
    assert expected is not None
    mutated = _mutate(chunk, data)
    response = mutated.get("response")
    kept = isinstance(response, dict) and "usage" in response and mutated.get("type") == chunk.get("type")
    if "response" in chunk and not kept:
        return  # the usage lives inside `response.completed`: with that replaced there is none to read
    assert inspect_chunk(_b(mutated)).usage == expected
