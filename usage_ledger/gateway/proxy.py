"""The hot path: forward a call upstream and record it (every request outside `/_ledger/`, over ASGI).

    client ─► body (`gateway.body`: size, budget, pace) ─► call.started ─► upstream ─► relay bytes as they come
                strict: final bytes wait for the final event ◄──────────────────────────┘ SSE scanned on the side
                                                                                          (body / the stream's end marker)

Bytes in = bytes out, with one exception: a stream that did not ask for usage is sent upstream
with `stream_options.include_usage`, and what that changes is taken back from what the client
gets (the usage-only chunk cut out, vLLM's `system_fingerprint` put back: `gateway.observed`).
A client that disconnects cancels the upstream request: a watcher waits for the server's
`http.disconnect` and cancels the call's task. This is the only path: the tests drive it through
the real server on a loopback port, as `ledger serve` runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import structlog

from usage_ledger.gateway.body import ClientGone, read_body
from usage_ledger.gateway.call import Call
from usage_ledger.gateway.errors import GatewayError, RequestTimeout
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.headers import parse_ledger_headers
from usage_ledger.gateway.limits import ByteBudget, ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.recorder import Recorder
from usage_ledger.gateway.response import AbortResponse, Responder
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.gateway.upstream import Upstream

__all__ = ("AbortResponse", "Proxy")

log = structlog.get_logger("gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class Proxy:
    """The passthrough for every path outside `/_ledger/`: one `Call` per request."""

    def __init__(
        self,
        settings: GatewaySettings,
        upstream: Upstream,
        recorder: Recorder,
        metrics: Metrics,
        *,
        fingerprint_key: FingerprintKey | None = None,
    ) -> None:
        self.settings = settings
        self.limits = ServerLimits.from_settings(settings)
        self.fingerprint_key = fingerprint_key or FingerprintKey.generate()
        """Keys the fingerprints of recorded secrets (headers, query); in-memory random one if not given."""
        self.upstream = upstream
        self.recorder = recorder
        self.metrics = metrics
        self.request_bytes = ByteBudget(settings.max_request_bytes_in_flight)
        """Request-body bytes all requests hold while being received (`gateway.body`)."""
        self.stored_bytes = ByteBudget(settings.max_stored_bytes_in_flight)
        """Response bytes all calls keep for their blobs at once (`gateway.kept`)."""
        self.upstream_url = upstream.base_url
        self.upstream_forces_usage: bool | None = settings.upstream_forces_usage
        """Whether the upstream sends usage in every stream unasked; None until a stream shows it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Callable[[Any], Awaitable[None]]) -> None:
        received = time.time()
        client = Responder(send, scope)
        try:
            ledger_tags, headers = parse_ledger_headers(scope["headers"])
        except GatewayError as exc:
            await client.json(exc.status, exc.body(), close=True)  # its body is not read
            return
        read = await self.read_body(scope, receive, client)
        if read is None:
            return
        body, held = read
        try:
            await self._call(scope, receive, client, Call(self, scope, headers, body, received, ledger_tags))
        finally:
            self.request_bytes.give_back(held)

    async def read_body(self, scope: Scope, receive: Receive, client: Responder) -> tuple[bytes, int] | None:
        """The whole request body within the limits (`gateway.body`) and the budget bytes it holds;
        None once the refusal is answered (or the client left): nothing goes upstream."""
        try:
            return await read_body(scope["headers"], receive, self.limits, self.request_bytes, self.metrics)
        except ClientGone:
            return None
        except GatewayError as exc:
            if isinstance(exc, RequestTimeout):
                self.metrics.requests_timed_out += 1
                self.metrics.bodies_too_slow += 1
                log.info("request_body_timed_out", client=scope.get("client"), reason=exc.message)
            await client.json(exc.status, exc.body(), close=True)
            return None

    async def _call(self, scope: Scope, receive: Receive, client: Responder, call: Call) -> None:
        task = asyncio.current_task()
        assert task is not None
        call.task = task
        watcher = asyncio.create_task(_until_disconnect(receive, call))
        self.metrics.in_flight += 1
        try:
            await call.run(client)
        except AbortResponse as exc:
            log.info("response_aborted", call_id=call.call_id, reason=str(exc))
            if not client.abort():
                raise
        finally:
            self.metrics.in_flight -= 1
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _until_disconnect(receive: Receive, call: Call) -> None:
    """Wait for the client to go away (the body was read: only `http.disconnect` comes now)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    call.disconnected()
