"""A property over the recorded real-vLLM transcripts: whatever else a response grows, its usage still comes out.

Each body (or each chunk of a stream) gets unknown members of every JSON type at every level,
known members (other than `usage`) replaced by arbitrary JSON, and a stream gets extra events
(unknown objects, comments, other event names) between its chunks. The usage the gateway reads
(`Observed`, fed by the real `SseScanner`) must equal what the unmutated transcript gives.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.transcripts import Transcript, load_transcripts
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.observed import Observed
from usage_ledger.gateway.sse import SseScanner

WITH_USAGE = [t for t in load_transcripts() if t.status == 200 and t.method == "POST"]
if not WITH_USAGE:
    pytest.skip("no recorded transcripts under tests/fixtures/vllm-*/", allow_module_level=True)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
# members whose replacement legitimately changes what a chunk means (and so its usage)
_MEANING = frozenset({"usage", "type", "response", "choices"})


def read(body: bytes, sse: bool) -> tuple[int, int] | None:
    seen = Observed(Metrics(), injected=False, on_forced_usage=lambda: True)
    if sse:
        scanner = SseScanner()
        seen.events(scanner.feed(body))
        seen.events(scanner.close())
    else:
        seen.body(body, None)
    usage, _, _ = seen.usage_and_source(complete=True)
    return None if usage is None else (usage.prompt_tokens, usage.completion_tokens)


def mutate(value: Any, data: st.DataObject, *, top: bool) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            keep_meaning = key in _MEANING and top
            if key == "usage" or keep_meaning:
                out[key] = item if key == "usage" else mutate(item, data, top=False)
            elif data.draw(st.integers(0, 5)) == 0:
                out[key] = data.draw(_json)
            else:
                out[key] = mutate(item, data, top=False)
        for _ in range(data.draw(st.integers(0, 2))):
            name = data.draw(st.text(min_size=1, max_size=6).filter(lambda k: k not in value and k not in _MEANING))
            out[name] = data.draw(_json)
        return out
    if isinstance(value, list):
        return [mutate(item, data, top=False) for item in value]
    return value


def mutate_stream(body: bytes, data: st.DataObject) -> bytes:
    out = []
    for event in body.split(b"\n\n"):
        if not event:
            continue
        lines = event.split(b"\n")
        if lines[-1].startswith(b"data: {"):
            chunk = json.loads(lines[-1][6:])
            lines[-1] = b"data: " + json.dumps(mutate(chunk, data, top=True)).encode()
        out.append(b"\n".join(lines) + b"\n\n")
        extra = data.draw(st.sampled_from([None, "object", "comment", "event"]))
        if extra == "object":
            unknown = st.dictionaries(st.text(max_size=5).filter(lambda k: k not in _MEANING), _json)
            out.append(b"data: " + json.dumps(data.draw(unknown)).encode() + b"\n\n")
        elif extra == "comment":
            out.append(b": keep-alive\n\n")
        elif extra == "event":
            out.append(b"event: vendor.note\ndata: " + json.dumps({"note": data.draw(_json)}).encode() + b"\n\n")
    return b"".join(out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(WITH_USAGE), st.data())
def test_usage_survives_any_growth_of_a_recorded_response(transcript: Transcript, data: st.DataObject) -> None:
    expected = read(transcript.body, transcript.is_sse)
    if transcript.is_sse:
        mutated = mutate_stream(transcript.body, data)
    else:
        mutated = json.dumps(mutate(json.loads(transcript.body), data, top=True)).encode()
    assert read(mutated, transcript.is_sse) == expected
