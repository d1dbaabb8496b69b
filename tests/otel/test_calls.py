"""`response_model` against the responses real vLLM sent (tests/fixtures), and odd bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gateway.transcripts import Transcript, data_payloads, load_transcripts
from usage_ledger.otel.calls import response_model

ANSWERS = [t for t in load_transcripts() if t.method == "POST" and t.status == 200]


def _named(payload: dict[str, Any]) -> str | None:
    model = payload.get("model")
    if model is None and isinstance(payload.get("response"), dict):
        model = payload["response"].get("model")
    return model if isinstance(model, str) else None


def _expected(t: Transcript) -> str | None:
    payloads = data_payloads(t.body) if t.is_sse else [json.loads(t.body)]
    return next((m for p in payloads if (m := _named(p)) is not None), None)


@pytest.mark.parametrize("transcript", ANSWERS, ids=lambda t: t.name)
def test_the_model_vllm_answered_with(transcript: Transcript) -> None:
    expected = _expected(transcript)
    assert response_model(transcript.body) == expected
    if transcript.path.endswith(("/chat/completions", "/completions", "/responses")):
        assert expected is not None  # every generation names its model, streamed or not


@pytest.mark.parametrize(
    "body", [b"", b"not json", b"[1, 2]", b'{"model": 3}', b"data: {oops\n\n", b"data: [DONE]\n\n"]
)
def test_a_body_that_names_no_model(body: bytes) -> None:
    assert response_model(body) is None
