"""The hot path: a raw ASGI passthrough that forwards a call upstream and records it.

    client ─► read body (≤ max_body_bytes) ─► call.started ─► upstream ─► relay bytes as they come
                                                                            │ SSE scanned on the side
                     strict: final bytes wait for the final event ◄─────────┘ (body / `data: [DONE]`)

Bytes in = bytes out, with one exception: a stream that did not ask for usage is sent upstream
with `stream_options.include_usage` and the usage-only chunk is cut out of what the client gets.
A client that disconnects cancels the upstream request (a watcher task cancels the call's task).
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
from gateway.headers import Header, forward_headers, parse_ledger_headers, recorded_headers, response_headers
from gateway.inspect import RequestInfo, inspect_chunk, inspect_request, inspect_response, with_usage_requested
from gateway.metrics import Metrics
from gateway.recorder import Recorder, new_call_id
from gateway.sse import SseEvent, SseScanner
from gateway.upstream import UpstreamClient, UpstreamResponse
from ledger.events import CallFailed, CallFinished, CallStarted, Timings, Usage, UsageSource
from ledger.settings import Settings

__all__ = ("AbortResponse", "Proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = structlog.get_logger("gateway")

CALL_ID_HEADER = b"x-ledger-call-id"
_DONE = b"[DONE]"
_COMPLETIONS = ("/completions",)


class AbortResponse(Exception):
    """Raised after the response started to make the server drop the client connection.

    The upstream failed mid-body; a clean end would tell the client the body was complete.
    """


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


async def _respond(send: Send, status: int, body: bytes, extra: list[Header]) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Proxy:
    """The ASGI callable for every path outside `/_ledger/`."""

    def __init__(self, settings: Settings, upstream: UpstreamClient, recorder: Recorder, metrics: Metrics) -> None:
        self.settings = settings
        self.upstream = upstream
        self.recorder = recorder
        self.metrics = metrics
        self.upstream_url = upstream.base_url

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
        call = _Call(self, scope, headers, body, received)
        call.started(ledger_tags.run, ledger_tags.tags)
        self.metrics.in_flight += 1
        try:
            await call.run(receive, send)
        finally:
            self.metrics.in_flight -= 1

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

    def __init__(self, proxy: Proxy, scope: Scope, headers: list[Header], body: bytes, received: float) -> None:
        self.proxy = proxy
        self.metrics = proxy.metrics
        self.recorder = proxy.recorder
        self.call_id = new_call_id()
        self.id_header = (CALL_ID_HEADER, self.call_id.encode())
        self.method: str = scope["method"]
        raw_path = scope.get("raw_path") or scope["path"].encode()
        self.path = raw_path.decode("latin-1")
        self.query = scope.get("query_string", b"").decode("latin-1")
        self.target = self.path + ("?" + self.query if self.query else "")
        self.headers = headers
        self.body = body
        self.received = received
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

    # -- recording -------------------------------------------------------------------------------
    def started(self, run: str | None, tags: dict[str, str]) -> None:
        digest = self.recorder.digest(self.body) if self.body else None
        info = self.info
        event = CallStarted(
            call_id=self.call_id,
            received_at=_ts(self.received) or datetime.now(UTC),
            method=self.method,
            path=self.path,
            query=self.query,
            run=run,
            tags=tags,
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

    async def _finished(self) -> None:
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
        self._report("call_proxied", timings)

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
    async def run(self, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(self._watch(receive, task))
        response: UpstreamResponse | None = None
        try:
            try:
                response = await self.proxy.upstream.send(
                    self.method, self.target, forward_headers(self.headers), self.upstream_body
                )
            except UpstreamError as exc:
                phase = "connect" if exc.code == "upstream_unreachable" else "headers"
                await self._fail_before_response(send, exc, phase, exc.reason)
                return
            except Exception as exc:  # a bug or protocol error of ours: still a JSON answer and a record
                log.exception("gateway_error", call_id=self.call_id)
                error = GatewayError(f"the gateway failed to forward the request: {type(exc).__name__}")
                await self._fail_before_response(send, error, "gateway", "gateway_error")
                return
            await self._relay(response, send)
        except asyncio.CancelledError:
            if not self.client_gone:
                raise
            task.uncancel()
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
            watcher.cancel()
            if response is not None:
                await _close_quietly(response)

    async def _fail_before_response(self, send: Send, exc: GatewayError, phase: str, reason: str) -> None:
        self.status = exc.status
        await self._failed(phase, reason, exc.message, wait=True)
        self.done = True
        await _respond(send, exc.status, exc.body(), [self.id_header])

    async def _watch(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.done:
                    self.client_gone = True
                    task.cancel()
                return

    async def _relay(self, response: UpstreamResponse, send: Send) -> None:
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
        await self.recorder.until_durable(self.started_durable)  # strict: no response before call.started
        await send({"type": "http.response.start", "status": response.status, "headers": out_headers})
        try:
            if scanning:
                tail = await self._relay_sse(response, send, cutting)
            else:
                tail = await self._relay_plain(response, send)
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
        await self._finished()
        self.done = True
        self.client_bytes += len(tail)
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _relay_plain(self, response: UpstreamResponse, send: Send) -> bytes:
        """Forward a body one chunk behind, so the last chunk can wait for the record."""
        held = b""
        raw = self.raw
        async for chunk in response.iter_raw():
            if not chunk:
                continue
            raw.append(chunk)
            if held:
                self.client_bytes += len(held)
                await send({"type": "http.response.body", "body": held, "more_body": True})
            held = chunk
        return held

    async def _relay_sse(self, response: UpstreamResponse, send: Send, cutting: bool) -> bytes:
        """Forward SSE bytes as they come; hold from `data: [DONE]` on, and cut the injected usage chunk."""
        scanner = SseScanner()
        raw = self.raw
        pending = b""  # stream bytes not yet sent, starting at stream offset `sent`
        sent = 0
        total = 0
        done_at: int | None = None
        cuts: list[tuple[int, int]] = []
        async for chunk in response.iter_raw():
            if not chunk:
                continue
            raw.append(chunk)
            total += len(chunk)
            events = scanner.feed(chunk)
            if events:
                self._observe(events, cuts, cutting)
                if done_at is None:
                    done_at = self._done_offset(events)
            if not cutting and done_at is None and not pending:
                sent = total
                self.client_bytes += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                continue
            pending += chunk
            limit = scanner.consumed if cutting else total
            if done_at is not None:
                limit = min(limit, done_at)
            if limit > sent:
                out = _without(pending, sent, limit, cuts)
                pending = pending[limit - sent :]
                sent = limit
                if out:
                    self.client_bytes += len(out)
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        closing = scanner.close()
        if closing:
            self._observe(closing, cuts, cutting)
        return _without(pending, sent, total, cuts)

    def _done_offset(self, events: list[SseEvent]) -> int | None:
        for event in events:
            if event.data == _DONE:
                return event.start
        return None

    def _observe(self, events: list[SseEvent], cuts: list[tuple[int, int]], cutting: bool) -> None:
        for event in events:
            data = event.data
            if data is None or data == _DONE:
                continue
            info = inspect_chunk(data)
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
