"""A tiny raw-ASGI OpenAI-compatible upstream for gateway tests (vLLM's stream shape, usage rules)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

CHUNK_HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'


def sse_chunks(n: int, *, include_usage: bool) -> list[bytes]:
    out = [
        CHUNK_HEAD
        + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    ]
    for i in range(n):
        reason = b'"length"' if i == n - 1 else b"null"
        out.append(
            CHUNK_HEAD
            + b'[{"index":0,"delta":{"content":"t%d "},"logprobs":null,"finish_reason":%s}]}\n\n' % (i, reason)
        )
    if include_usage:
        out.append(
            CHUNK_HEAD + b'[],"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (7 + n, n)
        )
    out.append(b"data: [DONE]\n\n")
    return out


def completion_body(n: int) -> bytes:
    return (
        b'{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}}' % (5 + n, n)
    )


class FakeUpstream:
    """Records what it received; answers chat completions (stream or not), /echo and /status/<code>."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.cancelled = asyncio.Event()
        self.split = 1  # send each SSE event in this many pieces (exercise the scanner)
        self.delay_s = 0.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"]]
        self.requests.append({"method": scope["method"], "path": scope["path"], "headers": headers, "body": body})
        path = scope["path"]
        if path.startswith("/status/"):
            code = int(path.split("/")[2])  # /status/<code>[/v1/chat/completions]
            payload = b'{"error":{"message":"nope","type":"BadRequestError","param":null,"code":%d}}' % code
            await _plain(send, code, payload)
        elif path == "/echo":
            echoed = json.dumps({"headers": headers, "body": body.decode(), "query": scope["query_string"].decode()})
            await _plain(send, 200, echoed.encode())
        elif path.endswith("/completions"):
            req = json.loads(body)
            n = int(req.get("max_tokens") or 4)
            if not req.get("stream"):
                await _plain(send, 200, completion_body(n), extra=[(b"x-request-id", b"req-abc")])
                return
            opts = req.get("stream_options") or {}
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
                }
            )
            try:
                for chunk in sse_chunks(n, include_usage=bool(opts.get("include_usage"))):
                    size = max(1, len(chunk) // self.split)
                    for i in range(0, len(chunk), size):
                        await send({"type": "http.response.body", "body": chunk[i : i + size], "more_body": True})
                        if self.delay_s:
                            await asyncio.sleep(self.delay_s)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        else:
            await _plain(send, 404, b'{"detail":"Not Found"}')


async def read_body(receive: Any) -> bytes:
    """A whole ASGI request body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def _plain(send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
