from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import Rig
from tests.gateway.upstream import completion_body, sse_chunks
from usage_ledger.ledger.events import CallFinished, CallStarted


async def test_non_stream_bytes_and_events(rig: Rig) -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.8}'
    resp = await rig.client.post(
        "/v1/chat/completions?x=1",
        content=body,
        headers={
            "content-type": "application/json",
            "authorization": "Bearer sk-secret",
            "x-ledger-run": "r1",
            "x-ledger-ticker": "AAPL",
            "x-ledger-tag-Kind": "nightly",
            "x-request-id": "rid-1",
        },
    )
    assert resp.status_code == 200
    assert resp.content == completion_body(3)
    call_id = resp.headers["x-ledger-call-id"]
    sent = rig.upstream.requests[-1]
    assert sent["body"] == body
    names = [name for name, _ in sent["headers"]]
    assert not any(name.startswith("x-ledger-") for name in names)
    assert ("x-request-id", "rid-1") in sent["headers"]
    assert ("authorization", "Bearer sk-secret") in sent["headers"]
    started, finished = await rig.events()
    assert isinstance(started, CallStarted) and isinstance(finished, CallFinished)
    assert started.call_id == finished.call_id == call_id
    assert started.run == "r1" and started.tags == {"ticker": "AAPL", "kind": "nightly"}
    assert started.model == "m" and started.sampling.max_tokens == 3 and started.sampling.temperature == 0.8
    assert started.query == "x=1" and not started.stream
    recorded = dict(started.request_headers)
    assert recorded["authorization"].startswith("hmac-sha256:") and "sk-secret" not in json.dumps(
        started.request_headers
    )
    assert finished.status == 200 and finished.usage is not None and finished.usage.completion_tokens == 3
    assert (
        finished.usage_source == "reported" and finished.finish_reasons == ["stop"] and finished.finish_choices == [0]
    )
    assert finished.upstream_request_id == "req-abc"


@pytest.mark.parametrize("split", [1, 7])
async def test_stream_usage_injected_and_removed(rig: Rig, split: int) -> None:
    rig.upstream.split = split
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}'
    resp = await rig.client.post("/v1/chat/completions", content=body)
    assert resp.content == b"".join(sse_chunks(5, include_usage=False))
    sent = json.loads(rig.upstream.requests[-1]["body"])
    assert sent["stream_options"] == {"include_usage": True}
    _, finished = await rig.events()
    assert isinstance(finished, CallFinished)
    assert finished.usage_source == "injected" and finished.usage is not None
    assert finished.usage.completion_tokens == 5 and finished.chunk_count == 6
    assert finished.finish_reasons == ["length"] and finished.finish_choices == [0]


async def test_stream_with_usage_requested_passes_through(rig: Rig) -> None:
    body = b'{"model":"m","messages":[],"stream":true,"max_tokens":2,"stream_options":{"include_usage":true}}'
    resp = await rig.client.post("/v1/chat/completions", content=body)
    assert resp.content == b"".join(sse_chunks(2, include_usage=True))
    assert rig.upstream.requests[-1]["body"] == body
    _, finished = await rig.events()
    assert isinstance(finished, CallFinished) and finished.usage_source == "reported"


async def test_upstream_error_passes_through(rig: Rig) -> None:
    resp = await rig.client.post("/status/418/v1/chat/completions", content=b"{}")
    assert resp.status_code == 418
    assert resp.content == b'{"error":{"message":"nope","type":"BadRequestError","param":null,"code":418}}'
    _, finished = await rig.events()
    assert isinstance(finished, CallFinished) and finished.status == 418


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/health"), ("POST", "/status/418")])
async def test_requests_that_are_no_calls_are_proxied_and_not_recorded(rig: Rig, method: str, path: str) -> None:
    resp = await rig.client.request(method, path, content=b"{}" if method == "POST" else None)
    direct = rig.upstream.requests[-1]
    assert direct["path"] == path
    assert "x-ledger-call-id" not in resp.headers
    assert await rig.events() == []
    metrics = (await rig.client.get("/_ledger/metrics")).text
    assert "ledger_gateway_passed_through_total 1" in metrics


@pytest.mark.parametrize(
    "header",
    [
        ("x-ledger-run", "a" * 300),
        ("x-ledger-ticker", b"bad\xff"),  # obs-text passes HTTP parsing, not UTF-8 (a CTL: the server's 400)
        ("x-ledger-tag-bad!name", "x"),  # a legal HTTP token, not a tag name
        ("x-ledger-nope", "1"),
    ],
)
async def test_invalid_ledger_headers_400(rig: Rig, header: tuple[str, str | bytes]) -> None:
    value = header[1] if isinstance(header[1], bytes) else header[1].encode()
    resp = await rig.client.get("/v1/models", headers=[(header[0].encode(), value)])
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_ledger_header"
    assert rig.upstream.requests == [] and await rig.events() == []


def test_a_request_member_of_an_odd_type_costs_only_that_member() -> None:
    from usage_ledger.gateway.inspect import inspect_request

    info = inspect_request(b'{"model": 7, "stream": true, "max_tokens": 5, "temperature": "hot"}')
    assert info.stream and info.model is None and info.sampling.max_tokens == 5 and info.sampling.temperature is None
    assert inspect_request(b'{"model": 1e999999, "stream": true}').stream is False  # nothing readable at all
    assert inspect_request(b'{"model": "m", "max_output_tokens": 9}').sampling.max_tokens == 9  # Responses API
    # the client's own usage request is seen beside a continuous_usage_stats of another type than bool
    odd = inspect_request(b'{"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": 0}}')
    assert odd.stream and odd.wants_usage
