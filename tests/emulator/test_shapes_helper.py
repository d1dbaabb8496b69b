"""The shape comparison used by test_shape.py names the path that differs."""

from __future__ import annotations

from tests.emulator.shapes import differences, parse_sse, skeleton, stream_differences


def test_skeleton_keeps_keys_types_and_nulls() -> None:
    value = {"a": 1, "b": [1.5, 2.0], "c": None, "d": {"e": "x", "f": True}, "g": []}
    assert skeleton(value) == {"a": "int", "b": ["float"], "c": "null", "d": {"e": "str", "f": "bool"}, "g": []}


def test_differences_name_the_path() -> None:
    real = skeleton({"usage": {"prompt_tokens": 1, "details": None}, "choices": [{"token_ids": None}]})
    emulated = skeleton({"usage": {"prompt_tokens": 1.0}, "choices": [{"token_ids": None, "extra": 1}]})
    assert differences(real, emulated) == [
        '$.choices[].extra: the emulator sends it ("int"), vLLM does not',
        '$.usage.details: vLLM sends it ("null"), the emulator does not',
        '$.usage.prompt_tokens: vLLM "int" vs emulator "float"',
    ]
    assert differences(real, real) == []
    assert differences(skeleton({"x": []}), skeleton({"x": [1]})) == []  # empty lists say nothing


def test_stream_shapes_collapse_runs_and_compare_event_names() -> None:
    def chunk(content: str) -> str:
        return 'data: {"choices":[{"delta":{"content":"' + content + '"},"finish_reason":null}]}\n\n'

    done = "data: [DONE]\n\n"
    three = parse_sse(chunk("a") + chunk("b") + chunk("c") + done)
    one = parse_sse(chunk("a") + done)
    assert stream_differences(three, one) == []
    assert stream_differences(three, parse_sse(chunk("a"))) == [
        "event sequence: vLLM ['content chunk', '[DONE]'] vs emulator ['content chunk']"
    ]
    named = parse_sse('event: response.created\ndata: {"type": "response.created"}\n\n')
    other = parse_sse('event: response.done\ndata: {"type": "response.created"}\n\n')
    assert "event 0: vLLM `event: response.created` vs emulator `event: response.done`" in stream_differences(
        named, other
    )
