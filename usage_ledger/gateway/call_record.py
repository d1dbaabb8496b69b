"""What a call tells the ledger and the operator: its events, the usage they carry, its log line and metrics.

`CallRecord` holds the facts of one call: its request's, fixed when the request is received, and its
response's, noted by the `gateway.call.Call` that owns it as they arrive (status, headers, the bytes
the client got, what `Observed` saw, the `KeptBody`, the `RelayPlan`). Made of them:

    started    `call.started`, submitted once (strict: durable before the request goes upstream)
    finished   `call.finished` (or `call.failed` for an error inside the stream), before the last bytes
    failed     `call.failed`, whatever phase the call failed in
    report     the canonical log line and the latency metrics

What the usage of a call is, and where it came from (`ledger.events.UsageSource`), is decided in
`gateway.observed.Observed`, once, for finished and failed calls alike.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from usage_ledger.gateway._http import Upstream
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.headers import Header, LedgerTags, recorded_headers
from usage_ledger.gateway.inspect import RequestInfo
from usage_ledger.gateway.kept import KeptBody
from usage_ledger.gateway.limits import ByteBudget
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.observed import Observed
from usage_ledger.gateway.recorder import NotRecorded, Recorder
from usage_ledger.gateway.relay import RelayPlan
from usage_ledger.gateway.secrets import recorded_query
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import CallFailed, CallFinished, CallStarted, Durable, Timings, Usage, UsageSource

__all__ = ("CallRecord", "Proxy")

log = structlog.get_logger("gateway")


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


def _timestamp(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


class CallRecord:
    """The facts of one call and what is made of them: events, log line, metrics (owned by its `gateway.call.Call`)."""

    def __init__(
        self,
        proxy: Proxy,
        call_id: str,
        method: str,
        path: str,
        query: str,
        headers: list[Header],
        body: bytes,
        received: float,
        ledger_tags: LedgerTags,
        info: RequestInfo,
        recorded: bool,
        seen: Observed,
        raw: KeptBody,
    ) -> None:
        self.proxy = proxy
        self.recorder = proxy.recorder
        self.metrics = proxy.metrics
        # the request's facts, fixed from here on
        self.call_id = call_id
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.received = received
        self.ledger_tags = ledger_tags
        self.info = info
        self.recorded = recorded
        """A call (`gateway.paths.call_path`); else a request passed unrecorded, with a log line and no events."""
        # the response's facts, noted by the call as they arrive
        self.seen = seen
        self.raw = raw
        self.status: int | None = None
        """The status the client gets (or got): the upstream's, or the gateway's own error answer's."""
        self.headers_at: float | None = None
        self.response_headers: list[Header] = []
        self.upstream_request_id: str | None = None
        self.client_bytes = 0
        self.plan: RelayPlan | None = None
        self.started_durable: asyncio.Future[Durable] | None = None

    def response_began(self, at: float, status: int, headers: list[Header], plan: RelayPlan) -> None:
        """The upstream's response headers arrived `at`; `plan` is how its body goes to the client."""
        self.headers_at = at
        self.status = status
        self.response_headers = headers
        self.plan = plan
        self.upstream_request_id = plan.request_id

    def started(self) -> None:
        """Submit `call.started` (once): strict, before the request goes upstream (the call awaits it); async,
        right after, so building the event overlaps the upstream's work."""
        if self.started_durable is not None or not self.recorded:
            return
        digest = self.recorder.digest(self.body) if self.body else None
        info = self.info
        event = CallStarted(
            call_id=self.call_id,
            received_at=_timestamp(self.received) or datetime.now(UTC),
            method=self.method,
            path=self.path,
            query=recorded_query(self.query, self.proxy.fingerprint_key),
            run=self.ledger_tags.run,
            tags=self.ledger_tags.tags,
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
            received=_timestamp(self.received) or datetime.now(UTC),
            upstream_headers=_timestamp(self.headers_at),
            first_token=_timestamp(self.seen.first_token),
            last_token=_timestamp(self.seen.last_token),
            finished=datetime.now(UTC),
        )

    def _raw_body(self) -> tuple[str | None, bytes | None, int]:
        data = self.raw.whole()
        if data is None:
            if self.raw.omitted:
                self.metrics.response_blobs_omitted += 1
            return None, None, self.raw.size
        return self.recorder.digest(data), data, len(data)

    async def finished(self) -> Timings:
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

    async def failed(self, phase: str, reason: str, detail: str, *, wait: bool) -> bool:
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
        self.report("call_failed", timings, reason=reason, phase=phase, detail=detail)
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

    def report(self, message: str, timings: Timings, **extra: Any) -> None:
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
