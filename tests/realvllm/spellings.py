"""Each spelling of an inference path (tests/gateway/spellings.py) sent byte for byte to real vLLM and through the
gateway: whatever vLLM answers as an inference call is recorded or refused, never relayed unrecorded (#52, point 1).
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from tests.gateway.spellings import SPELLINGS
from tests.realvllm import harness
from tests.realvllm.checks import Stack
from tests.realvllm.harness import Tally

__all__ = ("Outcome", "send_other_apis", "send_spellings")


@dataclass(frozen=True)
class Outcome:
    target: bytes
    direct_status: int
    direct_inference: bool
    """vLLM answered the spelling itself with an inference result (a body with usage)."""
    status: int
    call_id: str | None
    refused: bool
    vllm: Tally
    """vLLM's counters moved by the request through the gateway."""


def post_raw(url: str, target: bytes, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One POST with `target` written as is on the request line (no client normalises it)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode()
    head = b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        target,
        host.encode(),
        port,
        len(body),
    )
    with socket.create_connection((host, port), timeout=120) as sock:
        sock.sendall(head + extra + b"connection: close\r\n\r\n" + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def send_spellings(stack: Stack, run: str) -> list[Outcome]:
    """Every spelling straight to vLLM, then through the gateway with vLLM's counters read around it."""
    case = stack.case("chat").body
    assert isinstance(case, dict)
    body = json.dumps({**case, "max_tokens": 4}).encode()
    return _send(stack, run, [(target, body) for target in SPELLINGS])


def send_other_apis(stack: Stack, run: str) -> list[Outcome]:
    """vLLM's inference routes beyond the OpenAI ones: Anthropic messages, SageMaker invocations, batched chat."""
    case = stack.case("chat").body
    assert isinstance(case, dict)
    chat = {**case, "max_tokens": 4}
    requests = [
        (b"/v1/messages", {"model": chat["model"], "max_tokens": 4, "messages": chat["messages"]}),
        (b"/invocations", chat),
        (b"/v1/chat/completions/batch", {**chat, "messages": [chat["messages"], chat["messages"]]}),
    ]
    return _send(stack, run, [(target, json.dumps(body).encode()) for target, body in requests])


def _send(stack: Stack, run: str, requests: list[tuple[bytes, bytes]]) -> list[Outcome]:
    outcomes = []
    for index, (target, body) in enumerate(requests):
        direct_status, _, direct_body = post_raw(stack.vllm.url, target, body, {})
        before = harness.scrape_counters(stack.vllm.url)
        tags = {"X-Ledger-Run": run, "X-Ledger-Tag-Case": f"request-{index}"}
        status, headers, answer = post_raw(stack.gateway_url, target, body, tags)
        moved = harness.scrape_counters(stack.vllm.url) - before
        refused = status == 400 and json.loads(answer)["error"]["code"] == "non_canonical_path"
        outcomes.append(
            Outcome(
                target,
                direct_status,
                direct_status == 200 and b'"usage"' in direct_body,
                status,
                headers.get("x-ledger-call-id"),
                refused,
                moved,
            )
        )
    return outcomes
