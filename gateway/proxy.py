"""The hot path: forward a call upstream and record it (from `gateway.server`, or as raw ASGI).

    client ─► body (≤ max_body_bytes) ─► call.started ─► upstream ─► relay bytes as they come
                                                                       │ SSE scanned on the side
                strict: final bytes wait for the final event ◄─────────┘ (body / `data: [DONE]`)

Bytes in = bytes out, with one exception: a stream that did not ask for usage is sent upstream
with `stream_options.include_usage` and the usage-only chunk is cut out of what the client gets.
Under `gateway.server` (`Proxy.handle`) upstream bytes are relayed from the upstream connection's
protocol callback straight to the client's transport (`RawResponse.pipe`, `Exchange.push`); the
ASGI entry (`Proxy.__call__`, for tests and embedding) relays through `send`. Both share `_Call`
and the relays. A client that disconnects cancels the upstream request (the call's task is cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

import structlog

from gateway.errors import BodyTooLarge, GatewayError, UpstreamError
from gateway.headers import (
    Header,
    LedgerTags,
    forward_headers,
    parse_ledger_headers,
    recorded_headers,
    response_headers,
)
from gateway.inspect import (
    TOKEN_CHUNK,
    RequestInfo,
    inspect_chunk,
    inspect_request,
    inspect_response,
    with_usage_requested,
)
from gateway.metrics import Metrics
from gateway.rawclient import RawResponse
from gateway.recorder import Recorder, new_call_id
from gateway.server import AbortSignal, Exchange, Request
from gateway.sse import SseEvent, SseScanner
from gateway.upstream import UpstreamClient, UpstreamResponse
from ledger.events import CallFailed, CallFinished, CallStarted, Timings, Usage, UsageSource
from ledger.settings import Settings
from ledger.writer import Durable

__all__ = ("AbortResponse", "Proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = structlog.get_logger("gateway")

CALL_ID_HEADER = b"x-ledger-call-id"
_DONE = b"[DONE]"
_COMPLETIONS = ("/completions",)


class AbortResponse(AbortSignal):
    """Raised after the response started to make the server drop the client connection.

    The upstream failed mid-body; a clean end would tell the client the body was complete.
    """


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def _json_headers(body: bytes, extra: list[Header]) -> list[Header]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]


async def _respond(send: Send, status: int, body: bytes, extra: list[Header]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _json_headers(body, extra)})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Client:
    """Where a call's response goes: the server's `Exchange`, or an ASGI `send` (`_AsgiClient`)."""

    push: Callable[[bytes], None] | None = None
    """Write body bytes synchronously (from the upstream's protocol callback); None when not possible."""

    async def start(self, status: int, headers: list[Header]) -> None:
        raise NotImplementedError

    async def send(self, data: bytes) -> None:
        raise NotImplementedError

    async def end(self, data: bytes) -> None:
        raise NotImplementedError

    def flow(self, hold: Callable[[bool], None] | None) -> None:
        """Register who to pause while the client is not reading (only where `push` is used)."""


class _ExchangeClient(_Client):
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


class _AsgiClient(_Client):
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

    def __init__(self, settings: Settings, upstream: UpstreamClient, recorder: Recorder, metrics: Metrics) -> None:
        self.settings = settings
        self.upstream = upstream
        self.recorder = recorder
        self.metrics = metrics
        self.upstream_url = upstream.base_url

    async def handle(self, request: Request, exchange: Exchange) -> None:
        """Serve one request from `gateway.server` (its body is complete and within the limit)."""
        try:
            ledger_tags, headers = parse_ledger_headers(request.headers)
        except GatewayError as exc:
            exchange.respond_json(exc.status, exc.body())
            return
        path = request.raw_path.decode("latin-1")
        query = request.query.decode("latin-1")
        call = _Call(self, request.method, path, query, headers, request.body, request.received, ledger_tags)
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
        call = _Call(self, scope["method"], raw_path.decode("latin-1"), query, headers, body, received, ledger_tags)
        self.metrics.in_flight += 1
        watcher = asyncio.create_task(self._watch(receive, call))
        try:
            await call.run(_AsgiClient(send))
        finally:
            watcher.cancel()
            self.metrics.in_flight -= 1

    @staticmethod
    async def _watch(receive: Receive, call: _Call) -> None:
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


class _Call:
    """One proxied call: its state from request to final event."""

    def __init__(
        self,
        proxy: Proxy,
        method: str,
        path: str,
        query: str,
        headers: list[Header],
        body: bytes,
        received: float,
        ledger_tags: LedgerTags,
    ) -> None:
        self.proxy = proxy
        self.metrics = proxy.metrics
        self.recorder = proxy.recorder
        self.call_id = new_call_id()
        self.id_header = (CALL_ID_HEADER, self.call_id.encode())
        self.method = method
        self.path = path
        self.query = query
        self.target = self.path + ("?" + self.query if self.query else "")
        self.headers = headers
        self.body = body
        self.received = received
        self.run_name = ledger_tags.run
        self.tags = ledger_tags.tags
        self.info = inspect_request(body) if self.method == "POST" else RequestInfo()
        self.upstream_body = body
        self.injected = False
        if self.info.stream and not self.info.wants_usage and self.path.endswith(_COMPLETIONS):
            rewritten = with_usage_requested(body)
            if rewritten is not None:
                self.upstream_body = rewritten
                self.injected = True
                self.metrics.usage_injected += 1
        # response state
        self.status: int | None = None
        self.headers_at: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.usage: Usage | None = None
        self.reasons: list[str] = []
        self.chunk_count = 0
        self.client_bytes = 0
        self.stream_error = False
        self.vllm_metrics: dict[str, float] | None = None
        self.upstream_request_id: str | None = None
        self.response_headers: list[Header] = []
        self.raw: list[bytes] = []
        self.client_gone = False
        self.done = False
        self.task: asyncio.Task[Any] | None = None
        self.started_durable: asyncio.Future[Durable] | None = None

    # -- recording -------------------------------------------------------------------------------
    def started(self) -> None:
        """Submit `call.started` (once): right after the request went upstream, so building the event
        overlaps the upstream's work; before any response byte or final event in any case."""
        if self.started_durable is not None:
            return
        digest = self.recorder.digest(self.body) if self.body else None
        info = self.info
        event = CallStarted(
            call_id=self.call_id,
            received_at=_ts(self.received) or datetime.now(UTC),
            method=self.method,
            path=self.path,
            query=self.query,
            run=self.run_name,
            tags=self.tags,
            request_headers=recorded_headers(self.headers),
            request_blob=digest,
            request_bytes=len(self.body),
            model=info.model,
            stream=info.stream,
            sampling=info.sampling,
            upstream=self.proxy.upstream_url,
        )
        self.started_durable = self.recorder.started(event, self.body if digest else None)

    def _usage_source(self) -> UsageSource:
        if self.usage is None:
            return "absent"
        return "injected" if self.injected else "reported"

    def _timings(self) -> Timings:
        return Timings(
            received=_ts(self.received) or datetime.now(UTC),
            upstream_headers=_ts(self.headers_at),
            first_token=_ts(self.first_token),
            last_token=_ts(self.last_token),
            finished=datetime.now(UTC),
        )

    def _raw_body(self) -> tuple[str | None, bytes | None, int]:
        if not self.raw:
            return None, None, 0
        data = self.raw[0] if len(self.raw) == 1 else b"".join(self.raw)
        return self.recorder.digest(data), data, len(data)

    async def _finished(self) -> Timings:
        """Record the final event (strict: until durable); the caller then sends the last bytes and logs."""
        digest, data, size = self._raw_body()
        timings = self._timings()
        event: CallFinished | CallFailed
        if self.stream_error:
            event = self._failure("stream", "upstream_error_in_stream", "", digest, timings)
            self.metrics.failures["upstream_error_in_stream"] += 1
        else:
            event = CallFinished(
                call_id=self.call_id,
                status=self.status or 0,
                upstream_request_id=self.upstream_request_id,
                response_headers=recorded_headers(self.response_headers),
                response_blob=digest,
                response_bytes=size,
                usage=self.usage,
                usage_source=self._usage_source(),
                finish_reasons=self.reasons,
                chunk_count=self.chunk_count,
                timings=timings,
                vllm_metrics=self.vllm_metrics,
            )
        self.metrics.calls[self.status or 0] += 1
        self.metrics.response_bytes += size
        if self.usage is not None:
            self.metrics.prompt_tokens += self.usage.prompt_tokens
            self.metrics.completion_tokens += self.usage.completion_tokens
        await self.recorder.finish(event, data)
        return timings

    async def _failed(self, phase: str, reason: str, detail: str, *, wait: bool) -> None:
        digest, data, _ = self._raw_body()
        timings = self._timings()
        event = self._failure(phase, reason, detail, digest, timings)
        self.metrics.failures[reason] += 1
        await self.recorder.finish(event, data, wait=wait)
        self._report("call_failed", timings, reason=reason, phase=phase, detail=detail)

    def _failure(self, phase: str, reason: str, detail: str, digest: str | None, timings: Timings) -> CallFailed:
        return CallFailed(
            call_id=self.call_id,
            phase=phase,  # type: ignore[arg-type]
            reason=reason,  # type: ignore[arg-type]
            detail=detail,
            client_status=self.status,
            client_bytes=self.client_bytes,
            response_blob=digest,
            usage=self.usage,
            usage_source=self._usage_source(),
            chunk_count=self.chunk_count,
            timings=timings,
        )

    def _report(self, message: str, timings: Timings, **extra: Any) -> None:
        """The canonical log line of the call, and its latency metrics."""
        end = timings.finished.timestamp() if timings.finished else time.time()
        self.metrics.duration.observe(end - self.received)
        if self.first_token is not None:
            self.metrics.ttft.observe(self.first_token - self.received)
        usage = self.usage
        log.info(
            message,
            call_id=self.call_id,
            method=self.method,
            path=self.path,
            status=self.status,
            stream=self.info.stream,
            model=self.info.model,
            duration_ms=round((end - self.received) * 1000, 3),
            upstream_headers_ms=None if self.headers_at is None else round((self.headers_at - self.received) * 1000, 3),
            ttft_ms=None if self.first_token is None else round((self.first_token - self.received) * 1000, 3),
            chunks=self.chunk_count,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            usage_source=self._usage_source(),
            **extra,
        )

    # -- proxying --------------------------------------------------------------------------------
    def disconnected(self) -> None:
        """The client went away: cancel the call (and with it the upstream request) unless it is done."""
        if not self.done and self.task is not None:
            self.client_gone = True
            self.task.cancel()

    async def run(self, client: _Client) -> None:
        task = self.task = asyncio.current_task()
        assert task is not None
        response: UpstreamResponse | None = None
        try:
            try:
                response = await self.proxy.upstream.send(
                    self.method, self.target, forward_headers(self.headers), self.upstream_body, on_sent=self.started
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
            if not self.client_gone:
                raise
            task.uncancel()
            self.started()
            if response is not None:
                await _close_quietly(response)
                response = None
            await self._failed(
                "stream" if self.info.stream else ("body" if self.status else "headers"),
                "upstream_error_in_stream" if self.stream_error else "client_disconnected",
                "the client closed the connection; the upstream request was cancelled",
                wait=False,
            )
        finally:
            self.task = None
            if response is not None:
                await _close_quietly(response)

    async def _fail_before_response(self, client: _Client, exc: GatewayError, phase: str, reason: str) -> None:
        self.started()
        self.status = exc.status
        await self._failed(phase, reason, exc.message, wait=True)
        self.done = True
        body = exc.body()
        await client.start(exc.status, _json_headers(body, [self.id_header]))
        await client.end(body)

    async def _relay(self, response: UpstreamResponse, client: _Client) -> None:
        self.headers_at = time.time()
        self.status = response.status
        self.response_headers = response.headers
        sse = False
        encoded = False
        for name, value in response.headers:
            if name == b"content-type" and value.startswith(b"text/event-stream"):
                sse = True
            elif name == b"content-encoding" and value not in (b"identity", b""):
                encoded = True
            elif name == b"x-request-id":
                self.upstream_request_id = value.decode("latin-1")
        scanning = sse and not encoded
        cutting = scanning and self.injected
        out_headers = response_headers(response.headers, drop_length=cutting)
        out_headers.append(self.id_header)
        self.started()
        assert self.started_durable is not None
        await self.recorder.until_durable(self.started_durable)  # strict: no response before call.started
        await client.start(response.status, out_headers)
        relay: _SseRelay | _PlainRelay = _SseRelay(self, cutting) if scanning else _PlainRelay(self)
        try:
            push = client.push
            if push is not None and isinstance(response, RawResponse):
                feed = relay.feed

                def sink(chunk: bytes) -> None:
                    out = feed(chunk)
                    if out:
                        self.client_bytes += len(out)
                        push(out)

                client.flow(response.hold)
                try:
                    await response.pipe(sink)
                finally:
                    client.flow(None)
            else:
                async for chunk in response.iter_raw():
                    out = relay.feed(chunk)
                    if out:
                        self.client_bytes += len(out)
                        await client.send(out)
            tail = relay.close()
        except UpstreamError as exc:
            await self._failed("stream" if sse else "body", exc.reason, exc.message, wait=True)
            self.done = True
            raise AbortResponse(exc.message) from exc
        if not scanning and self.raw and self.status is not None:
            body = self.raw[0] if len(self.raw) == 1 else b"".join(self.raw)
            described = inspect_response(body)
            self.usage = described.usage
            self.reasons = list(described.finish_reasons)
            self.vllm_metrics = described.metrics
            if self.upstream_request_id is None:
                self.upstream_request_id = described.request_id
        timings = await self._finished()
        self.done = True
        self.client_bytes += len(tail)
        await client.end(tail)
        self._report("call_proxied", timings)  # after the last bytes: the log line is not on the client's path

    def _observe(self, events: list[SseEvent], cuts: list[tuple[int, int]], cutting: bool) -> int | None:
        """Note what the events say; returns the stream offset of the first `data: [DONE]` among them."""
        done: int | None = None
        for event in events:
            data = event.data
            if data is None:
                continue
            if data == _DONE:
                if done is None:
                    done = event.start
                continue
            info = inspect_chunk(data)
            if info is TOKEN_CHUNK:  # nearly every event: one token, nothing else to note
                self.chunk_count += 1
                self.last_token = now = time.time()
                if self.first_token is None:
                    self.first_token = now
                continue
            if cutting and info.usage_only:
                cuts.append((event.start, event.end))
            else:
                self.chunk_count += 1
            if info.has_token:
                now = time.time()
                if self.first_token is None:
                    self.first_token = now
                self.last_token = now
            if info.usage is not None:
                self.usage = info.usage
            if info.finish_reasons:
                self.reasons.extend(info.finish_reasons)
            if info.error:
                self.stream_error = True
            if info.metrics is not None:
                self.vllm_metrics = info.metrics
        self.metrics.chunks += len(events)
        return done


class _PlainRelay:
    """A body forwarded one chunk behind, so the last chunk can wait for the record."""

    __slots__ = ("held", "raw")

    def __init__(self, call: _Call) -> None:
        self.raw = call.raw
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to send now."""
        if not chunk:
            return b""
        self.raw.append(chunk)
        out, self.held = self.held, chunk
        return out

    def close(self) -> bytes:
        """The bytes held back: they go out once the call is recorded."""
        return self.held


class _SseRelay:
    """SSE bytes forwarded as they come; held from `data: [DONE]` on; the injected usage chunk cut out."""

    __slots__ = ("call", "cuts", "cutting", "done_at", "pending", "raw", "scanner", "sent", "total")

    def __init__(self, call: _Call, cutting: bool) -> None:
        self.call = call
        self.cutting = cutting
        self.scanner = SseScanner()
        self.raw = call.raw
        self.pending = b""  # stream bytes not yet sent, starting at stream offset `sent`
        self.sent = 0
        self.total = 0
        self.done_at: int | None = None
        self.cuts: list[tuple[int, int]] = []

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to send now."""
        if not chunk:
            return b""
        self.raw.append(chunk)
        self.total += len(chunk)
        events = self.scanner.feed(chunk)
        if events:
            done = self.call._observe(events, self.cuts, self.cutting)
            if done is not None and self.done_at is None:
                self.done_at = done
        if self.done_at is None and not self.pending:
            if not self.cutting:
                self.sent = self.total
                return chunk
            cuts = self.cuts
            if self.scanner.consumed == self.total and (not cuts or cuts[-1][1] <= self.sent):
                self.sent = self.total  # whole events, none cut: the chunk as it came
                return chunk
        self.pending += chunk
        limit = self.scanner.consumed if self.cutting else self.total
        if self.done_at is not None:
            limit = min(limit, self.done_at)
        if limit <= self.sent:
            return b""
        out = _without(self.pending, self.sent, limit, self.cuts)
        self.pending = self.pending[limit - self.sent :]
        self.sent = limit
        return out

    def close(self) -> bytes:
        """End of the upstream body: what is left to send (from `data: [DONE]` on), minus cuts."""
        closing = self.scanner.close()
        if closing:
            self.call._observe(closing, self.cuts, self.cutting)
        return _without(self.pending, self.sent, self.total, self.cuts)


def _without(pending: bytes, start: int, stop: int, cuts: list[tuple[int, int]]) -> bytes:
    """Bytes [start, stop) of the stream (pending begins at `start`), minus the cut ranges."""
    if not cuts:
        return pending[: stop - start]
    out: list[bytes] = []
    pos = start
    for cut_start, cut_end in cuts:
        if cut_end <= pos or cut_start >= stop:
            continue
        if cut_start > pos:
            out.append(pending[pos - start : cut_start - start])
        pos = max(pos, cut_end)
    if pos < stop:
        out.append(pending[pos - start : stop - start])
    return b"".join(out)


async def _close_quietly(response: UpstreamResponse) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail; nothing left to save
        await response.aclose()
