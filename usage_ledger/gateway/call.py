"""One proxied request, from its body to its final event: forwarded, observed, recorded.

A request to an inference API (`gateway.inspect.is_inference`) is a call: `call.started` before
any response byte, `call.finished` / `call.failed` before the last bytes (strict durability).
Any other request (`GET /v1/models`, `/health`, `/metrics`, …) takes the same path and is not
recorded: it is no call in a run or a day.

What the usage of a call is, and where it came from (`ledger.events.UsageSource`), is decided in
`gateway.observed.Observed`, once, for finished and failed calls alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from usage_ledger.gateway._http import AbortSignal, Exchange, Upstream, UpstreamResponse
from usage_ledger.gateway.encoding import UnreadableBody
from usage_ledger.gateway.errors import GatewayError, LedgerUnavailable, UpstreamError
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.headers import Header, LedgerTags, forward_headers, recorded_headers
from usage_ledger.gateway.inspect import (
    USAGE_REQUEST_PATHS,
    RequestInfo,
    inspect_request,
    is_inference,
    with_usage_requested,
)
from usage_ledger.gateway.kept import KeptBody, usage_from_tail
from usage_ledger.gateway.limits import ByteBudget
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.observed import Observed
from usage_ledger.gateway.recorder import NotRecorded, Recorder, new_call_id
from usage_ledger.gateway.relay import RelayPlan, plan_relay
from usage_ledger.gateway.secrets import recorded_query
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import CallFailed, CallFinished, CallStarted, Durable, Timings, Usage, UsageSource


class Proxy(Protocol):
    """What a call uses of the proxy that runs it (`gateway.proxy.Proxy`; named here, not imported: no circle)."""

    settings: GatewaySettings
    fingerprint_key: FingerprintKey
    upstream: Upstream
    recorder: Recorder
    metrics: Metrics
    stored_bytes: ByteBudget
    upstream_url: str
    upstream_forces_usage: bool | None


__all__ = ("AbortResponse", "Call")

log = structlog.get_logger("gateway")

CALL_ID_HEADER = b"x-ledger-call-id"


class AbortResponse(AbortSignal):
    """Raised after the response started to make the server drop the client connection.

    The upstream failed mid-body, or the call could not be recorded: a clean end would tell the
    client the body was complete.
    """


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


class Call:
    """One proxied request: its state from request to final event."""

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
        self.method = method
        self.path = path
        self.query = query
        self.recorded = is_inference(method, path)
        self.call_id = new_call_id()
        self.id_header = (CALL_ID_HEADER, self.call_id.encode())
        self.target = self.path + ("?" + self.query if self.query else "")
        self.headers = headers
        self.body = body
        self.received = received
        self.run_name = ledger_tags.run
        self.tags = ledger_tags.tags
        self.info = inspect_request(body) if self.recorded else RequestInfo()
        self.upstream_body = body
        self.injected = False
        wants_injection = self.info.stream and not self.info.wants_usage and proxy.upstream_forces_usage is not True
        if wants_injection and self.path.endswith(USAGE_REQUEST_PATHS):
            rewritten = with_usage_requested(body)
            if rewritten is not None:
                self.upstream_body = rewritten
                self.injected = True
                self.metrics.usage_injected += 1
        # response state
        self.seen = Observed(self.metrics, injected=self.injected, on_forced_usage=self._upstream_forces_usage)
        self.status: int | None = None
        self.headers_at: float | None = None
        self.client_bytes = 0
        self.upstream_request_id: str | None = None
        self.response_headers: list[Header] = []
        cap = proxy.settings.max_stored_body_bytes if self.recorded else 0  # a request that is no call keeps none
        self.raw = KeptBody(proxy.stored_bytes, cap)
        """The response body kept for its blob, within the stored-body limits (`gateway.kept`)."""
        self.plan: RelayPlan | None = None
        """How the response goes to the client (known once its headers arrived)."""
        self.client_gone = False
        self.done = False
        self.task: asyncio.Task[Any] | None = None
        self.started_durable: asyncio.Future[Durable] | None = None

    # -- recording -------------------------------------------------------------------------------
    def started(self) -> None:
        """Submit `call.started` (once): right after the request went upstream, so building the event
        overlaps the upstream's work; before any response byte or final event in any case."""
        if self.started_durable is not None or not self.recorded:
            return
        digest = self.recorder.digest(self.body) if self.body else None
        info = self.info
        event = CallStarted(
            call_id=self.call_id,
            received_at=_ts(self.received) or datetime.now(UTC),
            method=self.method,
            path=self.path,
            query=recorded_query(self.query, self.proxy.fingerprint_key),
            run=self.run_name,
            tags=self.tags,
            request_headers=recorded_headers(self.headers, self.proxy.fingerprint_key),
            request_blob=digest,
            request_bytes=len(self.body),
            model=info.model,
            stream=info.stream,
            sampling=info.sampling,
            upstream=self.proxy.upstream_url,
        )
        self.started_durable = self.recorder.started(event, self.body if digest else None)

    def _usage_and_source(self, *, complete: bool) -> tuple[Usage | None, UsageSource, str]:
        problem = self.plan.problem if self.plan is not None else ""
        return self.seen.usage_and_source(complete=complete, problem=problem)

    def _timings(self) -> Timings:
        return Timings(
            received=_ts(self.received) or datetime.now(UTC),
            upstream_headers=_ts(self.headers_at),
            first_token=_ts(self.seen.first_token),
            last_token=_ts(self.seen.last_token),
            finished=datetime.now(UTC),
        )

    def _raw_body(self) -> tuple[str | None, bytes | None, int]:
        data = self.raw.whole()
        if data is None:
            if self.raw.omitted:
                self.metrics.response_blobs_omitted += 1
            return None, None, self.raw.size
        return self.recorder.digest(data), data, len(data)

    async def _finished(self) -> Timings:
        """Record the final event (strict: until durable); the caller then sends the last bytes and logs."""
        timings = self._timings()
        if not self.recorded:
            self.metrics.passed_through += 1
            return timings
        digest, data, size = self._raw_body()
        gaps_digest, gaps = self.seen.gaps_blob()
        self.metrics.response_bytes += size
        self.metrics.calls[self.status or 0] += 1
        event: CallFinished | CallFailed
        seen = self.seen
        if seen.stream_error:
            event = self._failure("stream", "upstream_error_in_stream", "", digest, timings, gaps_digest)
            self.metrics.failures["upstream_error_in_stream"] += 1
        else:
            usage, source, detail = self._usage_and_source(complete=True)
            event = CallFinished(
                call_id=self.call_id,
                status=self.status or 0,
                upstream_request_id=self.upstream_request_id,
                response_headers=recorded_headers(self.response_headers, self.proxy.fingerprint_key),
                response_blob=digest,
                response_bytes=size,
                response_blob_omitted=self.raw.omitted,
                usage=usage,
                usage_source=source,
                usage_detail=detail,
                finish_reasons=seen.reasons,
                finish_choices=seen.reason_choices,
                chunk_count=seen.chunk_count,
                chunk_gaps_blob=gaps_digest,
                timings=timings,
                request_metrics=seen.request_metrics,
                system_fingerprint=seen.system_fingerprint,
            )
            self._count_usage(usage, source, detail)
        await self.recorder.finish(event, data, gaps)
        return timings

    def _count_usage(self, usage: Usage | None, source: UsageSource, detail: str) -> None:
        self.metrics.usage_sources[source] += 1
        if usage is not None and source != "implausible":  # an implausible count enters no sum
            self.metrics.prompt_tokens += usage.prompt_tokens
            self.metrics.completion_tokens += usage.completion_tokens
        if source == "unreadable":
            log.warning("usage_unreadable", call_id=self.call_id, path=self.path, detail=detail)
        elif source == "implausible":
            log.warning("usage_implausible", call_id=self.call_id, path=self.path, detail=detail)

    async def _failed(self, phase: str, reason: str, detail: str, *, wait: bool) -> bool:
        """Record the failure; False when strict durability waited and the failure is durable nowhere."""
        timings = self._timings()
        self.metrics.failures[reason] += 1
        durable = True
        if self.recorded:
            digest, data, _ = self._raw_body()
            gaps_digest, gaps = self.seen.gaps_blob()
            event = self._failure(phase, reason, detail, digest, timings, gaps_digest)
            try:
                await self.recorder.finish(event, data, gaps, wait=wait)
            except NotRecorded:
                durable = False  # counted and logged by the recorder; the caller decides what the client sees
        self._report("call_failed", timings, reason=reason, phase=phase, detail=detail)
        return durable

    def _failure(
        self, phase: str, reason: str, detail: str, digest: str | None, timings: Timings, gaps_digest: str | None
    ) -> CallFailed:
        usage, source, usage_detail = self._usage_and_source(complete=False)
        self._count_usage(usage, source, usage_detail)
        return CallFailed(
            call_id=self.call_id,
            phase=phase,  # type: ignore[arg-type]
            reason=reason,  # type: ignore[arg-type]
            detail=detail,
            client_status=self.status,
            client_bytes=self.client_bytes,
            response_blob=digest,
            response_blob_omitted=self.raw.omitted,
            usage=usage,
            usage_source=source,
            usage_detail=usage_detail,
            chunk_count=self.seen.chunk_count,
            chunk_gaps_blob=gaps_digest,
            timings=timings,
        )

    def _report(self, message: str, timings: Timings, **extra: Any) -> None:
        """The canonical log line of the call, and its latency metrics."""
        end = timings.finished.timestamp() if timings.finished else time.time()
        if not self.recorded:
            log.debug("request_proxied", method=self.method, path=self.path, status=self.status, **extra)
            return
        self.metrics.duration.observe(end - self.received)
        first_token = self.seen.first_token
        if first_token is not None:
            self.metrics.ttft.observe(first_token - self.received)
        usage = self.seen.usage
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
            ttft_ms=None if first_token is None else round((first_token - self.received) * 1000, 3),
            chunks=self.seen.chunk_count,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            **extra,
        )

    # -- proxying --------------------------------------------------------------------------------
    def disconnected(self) -> None:
        """The client went away: cancel the call (and with it the upstream request) unless it is done."""
        if not self.done and self.task is not None:
            self.client_gone = True
            self.task.cancel()

    async def run(self, client: Exchange) -> None:
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
            # the client went away, or the server stops after its grace period: recorded as the client leaving
            stopping = not self.client_gone
            if not stopping:
                task.uncancel()
            self.started()
            if response is not None:
                await _close_quietly(response)
                response = None
            await self._failed(
                "stream" if self.info.stream else ("body" if self.status else "headers"),
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
        self.started()
        self.status = exc.status
        durable = await self._failed(phase, reason, exc.message, wait=True)
        if durable and self.started_durable is not None:
            try:
                await self.recorder.until_durable(self.started_durable)
            except NotRecorded:
                durable = False
        self.done = True
        if not durable:
            # Strict, and the call is durable nowhere: its own error answer, whole and naming a call id,
            # would be a response the ledger does not hold. Refused like an unrecorded start instead.
            await self._answer_unrecorded(client)
            return
        client.respond_json(exc.status, exc.body(), self._extra_headers())

    async def _relay(self, response: UpstreamResponse, client: Exchange) -> None:
        self.headers_at = time.time()
        self.status = response.status
        self.response_headers = response.headers
        plan = self.plan = plan_relay(
            response.headers, self.raw, self.seen.events, inspect=self.recorded, cut=self.injected
        )
        self.raw.expect(response.headers, whole_json=plan.readable_body and self.recorded, encoding=plan.decoder)
        relay = plan.relay
        self.seen.relay = plan.sse
        self.upstream_request_id = plan.request_id
        out_headers = [*plan.headers, *self._extra_headers()]
        self.started()
        if self.started_durable is not None:
            try:
                await self.recorder.until_durable(self.started_durable)  # strict: no response before call.started
            except NotRecorded:
                await self._refuse_unrecorded(response, client)
                return
        client.start_now(response.status, out_headers)
        try:
            push, feed = client.push, relay.feed

            def sink(chunk: bytes) -> None:  # from the upstream connection's callback: out at once
                out = feed(chunk)
                if out:
                    self.client_bytes += len(out)
                    push(out)

            client.flow(response.hold)  # a client that stops reading pauses the upstream
            try:
                await response.pipe(sink)
            finally:
                client.flow(None)
            tail = relay.close()
        except (UpstreamError, UnreadableBody) as exc:
            reason = exc.reason if isinstance(exc, UpstreamError) else "upstream_error_in_stream"
            await self._failed("stream" if plan.stream else "body", reason, str(exc), wait=True)
            self.done = True
            raise AbortResponse(str(exc)) from exc
        if plan.readable_body and self.raw and self.recorded:
            self.seen.body(self.raw.whole() or b"", plan.decoder)
            self.upstream_request_id = self.upstream_request_id or self.seen.request_id
        elif plan.readable_body and self.raw.omitted and self.recorded:
            self._read_tail()
        try:
            timings = await self._finished()
        except NotRecorded as exc:
            # Strict: the last bytes are still held back; without them the client sees a
            # truncated response (no final chunk or short of Content-Length), not a complete one.
            self.done = True
            raise AbortResponse(f"call not recorded: {exc}") from exc
        self.done = True
        self.client_bytes += len(tail)
        client.end_now(tail)
        self._report("call_proxied", timings)  # after the last bytes: the log line is not on the client's path

    async def _refuse_unrecorded(self, response: UpstreamResponse, client: Exchange) -> None:
        """Strict, and the call's start is durable nowhere: cancel the upstream request and answer 503 before
        any byte of its response, counted in the metrics (the writer's health says why)."""
        await _close_quietly(response)
        self.done = True
        await self._answer_unrecorded(client)

    async def _answer_unrecorded(self, client: Exchange) -> None:
        """503 `ledger_unavailable`, with no call id: the ledger cannot hold this call now."""
        self.metrics.refused_unrecorded += 1
        self.status = LedgerUnavailable.status
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
