"""The hot path: forward a call upstream and record it (from `gateway.server`, or as raw ASGI).

    client ─► body (≤ max_body_bytes) ─► call.started ─► upstream ─► relay bytes as they come
                                                                       │ SSE scanned on the side
                strict: final bytes wait for the final event ◄─────────┘ (body / the stream's end marker)

Bytes in = bytes out, with one exception: a stream that did not ask for usage is sent upstream
with `stream_options.include_usage`, and what that changes is taken back from what the client
gets (the usage-only chunk cut out, vLLM's `system_fingerprint` put back: `gateway.observed`).
Under `gateway.server` (`Proxy.handle`) upstream bytes are relayed from the upstream connection's
protocol callback straight to the client's transport (`RawResponse.pipe`, `Exchange.push`); the
ASGI entry (`Proxy.__call__`, for tests and embedding) relays through `send`. Both run a
`gateway.call.Call`. A client that disconnects cancels the upstream request (the call's task is cancelled).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from usage_ledger.gateway.call import Call
from usage_ledger.gateway.client import AbortResponse, Client, json_headers
from usage_ledger.gateway.errors import BodyTooLarge, GatewayError
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.headers import Header, parse_ledger_headers
from usage_ledger.gateway.limits import ByteBudget
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.recorder import Recorder
from usage_ledger.gateway.server import Exchange, Request
from usage_ledger.gateway.upstream import UpstreamClient
from usage_ledger.ledger.settings import Settings

__all__ = ("AbortResponse", "Proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def _respond(send: Send, status: int, body: bytes, extra: list[Header]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": json_headers(body, extra)})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _ExchangeClient(Client):
    __slots__ = ("exchange", "push")

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.push = exchange.push

    async def start(self, status: int, headers: list[Header]) -> None:
        self.exchange.start_now(status, headers)

    async def send(self, data: bytes) -> None:
        await self.exchange.send(data)

    async def end(self, data: bytes) -> None:
        self.exchange.end_now(data)

    def flow(self, hold: Callable[[bool], None] | None) -> None:
        self.exchange.flow(hold)


class _AsgiClient(Client):
    __slots__ = ("_send",)

    def __init__(self, send: Send) -> None:
        self._send = send

    async def start(self, status: int, headers: list[Header]) -> None:
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def send(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": False})


class Proxy:
    """The ASGI callable for every path outside `/_ledger/`."""

    def __init__(
        self,
        settings: Settings,
        upstream: UpstreamClient,
        recorder: Recorder,
        metrics: Metrics,
        *,
        fingerprint_key: FingerprintKey | None = None,
    ) -> None:
        self.settings = settings
        self.fingerprint_key = fingerprint_key or FingerprintKey.generate()
        """Keys the fingerprints of recorded secrets (headers, query); in-memory random one if not given."""
        self.upstream = upstream
        self.recorder = recorder
        self.metrics = metrics
        self.stored_bytes = ByteBudget(settings.max_stored_bytes_in_flight)
        """Response bytes all calls keep for their blobs at once (`gateway.kept`)."""
        self.upstream_url = upstream.base_url
        self.upstream_forces_usage: bool | None = settings.upstream_forces_usage
        """Whether the upstream sends usage in every stream unasked; None until a stream shows it."""

    async def handle(self, request: Request, exchange: Exchange) -> None:
        """Serve one request from `gateway.server` (its body is complete and within the limit)."""
        try:
            ledger_tags, headers = parse_ledger_headers(request.headers)
        except GatewayError as exc:
            exchange.respond_json(exc.status, exc.body())
            return
        path = request.raw_path.decode("latin-1")
        query = request.query.decode("latin-1")
        call = Call(self, request.method, path, query, headers, request.body, request.received, ledger_tags)
        exchange.on_disconnect = call.disconnected
        self.metrics.in_flight += 1
        try:
            await call.run(_ExchangeClient(exchange))
        finally:
            exchange.on_disconnect = None
            self.metrics.in_flight -= 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = time.time()
        try:
            ledger_tags, headers = parse_ledger_headers(scope["headers"])
            body = await self._read_body(headers, receive)
        except GatewayError as exc:
            await _respond(send, exc.status, exc.body(), [])
            return
        if body is None:
            return  # the client left before its request was complete: nothing to record
        raw_path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"").decode("latin-1")
        call = Call(self, scope["method"], raw_path.decode("latin-1"), query, headers, body, received, ledger_tags)
        self.metrics.in_flight += 1
        watcher = asyncio.create_task(self._watch(receive, call))
        try:
            await call.run(_AsgiClient(send))
        finally:
            watcher.cancel()
            self.metrics.in_flight -= 1

    @staticmethod
    async def _watch(receive: Receive, call: Call) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                call.disconnected()
                return

    async def _read_body(self, headers: list[Header], receive: Receive) -> bytes | None:
        limit = self.settings.max_body_bytes
        for name, value in headers:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise BodyTooLarge(f"the request body is {int(value)} bytes; the gateway accepts at most {limit}")
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > limit:
                raise BodyTooLarge(f"the request body exceeds {limit} bytes (LEDGER_MAX_BODY_BYTES)")
            return body
        parts = [body]
        size = len(body)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise BodyTooLarge(f"the request body exceeds {limit} bytes (LEDGER_MAX_BODY_BYTES)")
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)
