"""Recorded real-vLLM transcripts (tests/fixtures/vllm-*/): loading them, and what they say, read independently.

The readers here use `json` and plain dict access on purpose: they are the oracle the gateway's
own readers (`gateway.usage`, msgspec) are checked against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@dataclass(frozen=True)
class Transcript:
    name: str  # config/case
    config: str
    server_args: list[str]
    method: str
    path: str
    request_body: bytes
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def is_sse(self) -> bool:
        return any(k == "content-type" and v.startswith("text/event-stream") for k, v in self.headers)

    @property
    def request(self) -> dict[str, Any]:
        try:
            value = json.loads(self.request_body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def load_transcripts() -> list[Transcript]:
    found = []
    for file in sorted(FIXTURES.glob("vllm-*/*/*.json")):
        data = json.loads(file.read_text())
        request, response = data["request"], data["response"]
        body = request.get("body")
        raw = body.encode() if isinstance(body, str) else b"" if body is None else json.dumps(body).encode()
        found.append(
            Transcript(
                name=f"{file.parent.name}/{file.stem}",
                config=data["config"],
                server_args=list(data["server_args"]),
                method=request["method"],
                path=request["path"],
                request_body=raw,
                status=response["status"],
                headers=[(k.lower(), v) for k, v in response["headers"]],
                body=response["body"].encode(),
            )
        )
    return found


def data_payloads(body: bytes) -> list[dict[str, Any]]:
    """The JSON objects of an SSE body's `data:` lines (events are one line each in vLLM's streams)."""
    out = []
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            value = json.loads(line[6:])
            if isinstance(value, dict):
                out.append(value)
    return out


def _tokens(usage: dict[str, Any]) -> tuple[int, int]:
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens")) or 0
    return int(prompt), int(completion)


def expected_usage(t: Transcript) -> tuple[int, int] | None:
    """(prompt, completion) tokens for the whole call as the server reported them, or None."""
    if not t.is_sse:
        try:
            value = json.loads(t.body)
        except ValueError:
            return None
        usage = value.get("usage") if isinstance(value, dict) else None
        return _tokens(usage) if isinstance(usage, dict) else None
    for chunk in reversed(data_payloads(t.body)):
        if chunk.get("type") == "response.completed":
            return _tokens(chunk["response"]["usage"])
        if chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict):
            return _tokens(chunk["usage"])
    return None


def expected_fingerprint(t: Transcript) -> str | None:
    """The last `system_fingerprint` the server sent in the call's body or stream, or None."""
    try:
        payloads = list(data_payloads(t.body)) if t.is_sse else [json.loads(t.body)]
    except ValueError:
        return None
    found = None
    for payload in payloads:
        if isinstance(payload, dict) and isinstance(payload.get("system_fingerprint"), str):
            found = payload["system_fingerprint"]
    return found


def expected_metrics(t: Transcript) -> dict[str, Any] | None:
    """vLLM's per-request `metrics` block of the call, as the server sent it, or None."""
    if not t.is_sse:
        try:
            value = json.loads(t.body)
        except ValueError:
            return None
        return value.get("metrics") if isinstance(value, dict) else None
    found = None
    for chunk in data_payloads(t.body):
        if isinstance(chunk.get("metrics"), dict):
            found = chunk["metrics"]
        response = chunk.get("response")
        if chunk.get("type") == "response.completed" and isinstance(response, dict):
            found = response.get("metrics") or found
    return found
