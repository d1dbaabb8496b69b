"""One proxied request, from its body to its final event: forwarded, observed, recorded.

A request to an inference API (`gateway.paths.call_path`) is a call. With strict durability its
`call.started` is durable before the request goes upstream, and `call.finished` / `call.failed`
before the response's last bytes; with async both are submitted and not awaited.
Any other request (`GET /v1/models`, `/health`, `/metrics`, …) takes the same path and is not
recorded: it is no call in a run or a day. This module runs the call (upstream request, relay, the
client's answer); the facts it notes on the way, and the events, log line and metrics made of them,
are its `gateway.call_record.CallRecord`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog

from usage_ledger.gateway._http import AbortSignal, Exchange, UpstreamResponse
from usage_ledger.gateway.call_record import CallRecord, Proxy
from usage_ledger.gateway.encoding import UnreadableBody
from usage_ledger.gateway.errors import GatewayError, LedgerUnavailable, UpstreamError, UpstreamInvalid
from usage_ledger.gateway.headers import Header, LedgerTags, forward_headers
from usage_ledger.gateway.inspect import RequestInfo, inspect_request, with_usage_requested
from usage_ledger.gateway.kept import KeptBody, usage_from_tail
from usage_ledger.gateway.observed import Observed
from usage_ledger.gateway.paths import USAGE_REQUEST_PATHS
from usage_ledger.gateway.recorder import NotRecorded, new_call_id
from usage_ledger.gateway.relay import plan_relay

__all__ = ("AbortResponse", "Call")

log = structlog.get_logger("gateway")

CALL_ID_HEADER = b"x-ledger-call-id"


class AbortResponse(AbortSignal):
    """Raised after the response started to make the server drop the client connection.

    The upstream failed mid-body, or the call could not be recorded: a clean end would tell the
    client the body was complete.
    """


class Call:
    """One proxied request, run from its body to its final event; what is recorded of it is its `record`'s."""

    def __init__(
        self,
        proxy: Proxy,
        method: str,
        path: str,
        routed: str | None,
        query: str,
        headers: list[Header],
        body: bytes,
        received: float,
        ledger_tags: LedgerTags,
    ) -> None:
        self.proxy = proxy
        self.recorded = recorded = routed is not None
        """A call (`gateway.paths.call_path`: `routed` is the path the upstream routes it on), else passed unrecorded."""
        self.call_id = call_id = new_call_id()
        self.id_header = (CALL_ID_HEADER, call_id.encode())
        self.target = path + ("?" + query if query else "")
        info = inspect_request(body) if recorded else RequestInfo()
        self.upstream_body = body
        self.injected = False
        wants_injection = info.stream and not info.wants_usage and proxy.upstream_forces_usage is not True
        if wants_injection and routed is not None and routed.endswith(USAGE_REQUEST_PATHS):
            rewritten = with_usage_requested(body)
            if rewritten is not None:
                self.upstream_body = rewritten
                self.injected = True
                proxy.metrics.usage_injected += 1
        self.seen = seen = Observed(proxy.metrics, injected=self.injected, on_forced_usage=self._upstream_forces_usage)
        cap = proxy.settings.max_stored_body_bytes if recorded else 0  # a request that is no call keeps none
        self.raw = raw = KeptBody(proxy.stored_bytes, cap)
        """The response body kept for its blob, within the stored-body limits (`gateway.kept`)."""
        self.record = CallRecord(
            proxy, call_id, method, path, query, headers, body, received, ledger_tags, info, recorded, seen, raw
        )
        self.client_gone = False
        self.done = False
        self.task: asyncio.Task[Any] | None = None

    # -- proxying --------------------------------------------------------------------------------
    def disconnected(self) -> None:
        """The client went away: cancel the call (and with it the upstream request) unless it is done."""
        if not self.done and self.task is not None:
            self.client_gone = True
            self.task.cancel()

    async def run(self, client: Exchange) -> None:
        task = self.task = asyncio.current_task()
        assert task is not None
        record = self.record
        response: UpstreamResponse | None = None
        try:
            if self.recorded and record.recorder.strict and not await self._start_durably(client):
                return
            try:
                forwarded = forward_headers(record.headers)
                response = await self.proxy.upstream.send(
                    record.method, self.target, forwarded, self.upstream_body, on_sent=record.started
                )
            except UpstreamError as exc:
                phase = "connect" if exc.code == "upstream_unreachable" else "headers"
                await self._fail_before_response(client, exc, phase, exc.reason)
                return
            except Exception as exc:  # a bug or protocol error of ours: still a JSON answer and a record
                log.exception("gateway_error", call_id=self.call_id)
                error = GatewayError(f"the gateway failed to forward the request: {type(exc).__name__}")
                await self._fail_before_response(client, error, "gateway", "gateway_error")
                return
            await self._relay(response, client)
        except asyncio.CancelledError:
            # the client went away, or the server stops after its grace period: recorded as the client leaving
            stopping = not self.client_gone
            if not stopping:
                task.uncancel()
            record.started()
            if response is not None:
                await _close_quietly(response)
                response = None
            await record.failed(
                "stream" if record.info.stream else ("body" if record.status else "headers"),
                "upstream_error_in_stream" if self.seen.stream_error else "client_disconnected",
                "the client closed the connection; the upstream request was cancelled",
                wait=False,
            )
            if stopping:
                raise
        finally:
            self.task = None
            self.raw.release()  # recorded (strict: durable) or abandoned: the stored-body budget goes back
            if response is not None:
                await _close_quietly(response)

    def _extra_headers(self) -> list[Header]:
        return [self.id_header] if self.recorded else []

    async def _fail_before_response(self, client: Exchange, exc: GatewayError, phase: str, reason: str) -> None:
        record = self.record
        record.started()
        record.status = exc.status
        durable = await record.failed(phase, reason, exc.message, wait=True)
        self.done = True
        if isinstance(exc, UpstreamInvalid):
            client.keep_alive = False  # what followed a response that cannot be relayed is never read as one
        if not durable:
            # Strict, and the call is durable nowhere: its own error answer, whole and naming a call id,
            # would be a response the ledger does not hold. Refused like an unrecorded start instead.
            await self._answer_unrecorded(client)
            return
        client.respond_json(exc.status, exc.body(), self._extra_headers())

    async def _relay(self, response: UpstreamResponse, client: Exchange) -> None:
        record = self.record
        headers_at = time.time()
        plan = plan_relay(response.headers, self.raw, self.seen.events, inspect=self.recorded, cut=self.injected)
        record.response_began(headers_at, response.status, response.headers, plan)
        self.raw.expect(response.headers, whole_json=plan.readable_body and self.recorded, encoding=plan.decoder)
        relay = plan.relay
        self.seen.relay = plan.sse
        out_headers = plan.headers
        if self.recorded:  # the call id is the gateway's: an upstream's own one never reaches the client
            out_headers = [header for header in out_headers if header[0] != CALL_ID_HEADER]
            out_headers.append(self.id_header)
        record.started()  # async durability: submitted now at the latest (strict: durable before forwarding)
        client.start_now(response.status, out_headers)
        try:
            push, feed = client.push, relay.feed

            def sink(chunk: bytes) -> None:  # from the upstream connection's callback: out at once
                out = feed(chunk)
                if out:
                    record.client_bytes += len(out)
                    push(out)

            client.flow(response.hold)  # a client that stops reading pauses the upstream
            try:
                await response.pipe(sink)
            finally:
                client.flow(None)
            tail = relay.close()
        except (UpstreamError, UnreadableBody) as exc:
            reason = exc.reason if isinstance(exc, UpstreamError) else "upstream_error_in_stream"
            await record.failed("stream" if plan.stream else "body", reason, str(exc), wait=True)
            self.done = True
            raise AbortResponse(str(exc)) from exc
        if plan.readable_body and self.raw and self.recorded:
            self.seen.body(self.raw.whole() or b"", plan.decoder)
            record.upstream_request_id = record.upstream_request_id or self.seen.request_id
        elif plan.readable_body and self.raw.omitted and self.recorded:
            self._read_tail()
        try:
            timings = await record.finished()
        except NotRecorded as exc:
            # Strict: the last bytes are still held back; without them the client sees a
            # truncated response (no final chunk or short of Content-Length), not a complete one.
            self.done = True
            raise AbortResponse(f"call not recorded: {exc}") from exc
        self.done = True
        record.client_bytes += len(tail)
        client.end_now(tail)
        record.report("call_proxied", timings)  # after the last bytes: the log line is not on the client's path

    async def _start_durably(self, client: Exchange) -> bool:
        """Strict: make `call.started` durable (database or spool) before the upstream sees the request, so no
        call reaches the server without its record. False when it is durable nowhere: answered 503 instead."""
        record = self.record
        record.started()
        assert record.started_durable is not None
        try:
            await record.recorder.until_durable(record.started_durable)
        except NotRecorded:
            self.done = True
            await self._answer_unrecorded(client)
            return False
        return True

    async def _answer_unrecorded(self, client: Exchange) -> None:
        """503 `ledger_unavailable`, with no call id: the ledger cannot hold this call now."""
        self.proxy.metrics.refused_unrecorded += 1
        self.record.status = LedgerUnavailable.status
        error = LedgerUnavailable(
            "the ledger cannot record this call now (database and spool both failed); "
            f"retry after {LedgerUnavailable.retry_after_s} s"
        )
        client.respond_json(error.status, error.body(), [(b"retry-after", str(error.retry_after_s).encode())])

    def _read_tail(self) -> None:
        """A whole body too large to keep: its usage read from its last bytes (`gateway.kept`)."""
        usage, problem = usage_from_tail(self.raw.tail)
        seen = self.seen
        seen.usage, seen.usage_final, seen.usage_problem = usage, usage is not None, problem

    def _upstream_forces_usage(self) -> bool:
        """A stream showed usage on every chunk, unasked; whether to believe it (the setting decides, if set).

        Once believed, later streams are not rewritten: the upstream sends their usage anyway.
        """
        if self.proxy.upstream_forces_usage is False:
            return False
        if self.proxy.upstream_forces_usage is None:
            self.proxy.upstream_forces_usage = True
            log.info("upstream_forces_usage", upstream=self.proxy.upstream_url, call_id=self.call_id)
        return True


async def _close_quietly(response: UpstreamResponse) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail; nothing left to save
        await response.aclose()
