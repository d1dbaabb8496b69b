"""Sampling what the upstream server did: its `/metrics` (and `/v1/models`) as `server.sampled` events.

When it samples (an interval, a run's first call and end, start and shutdown) and why it never delays a call:
docs/server.md, "Sampling". An upstream without `/metrics` (404) turns it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import Counter

import httpx
import msgspec
import structlog

from usage_ledger.gateway._http import tls_context
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.gateway.upstream_metrics import MetricsUnreadable, parse_metrics
from usage_ledger.ledger import Durable, EventWriter, SampleTrigger, ServedModel, ServerSampled, new_event, utc_now

__all__ = ("RUN_END_DELAY_S", "SERVER_STREAM", "ServerSampler")

log = structlog.get_logger("gateway.sampler")

SERVER_STREAM = "server"
RUN_END_DELAY_S = 1.0
"""A run counts as ended (for its closing sample) once no call of it has been in flight this long."""


class _Models(msgspec.Struct):
    data: list[ServedModel] = []


def _without_credentials(url: str) -> str:
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None)).rstrip("/")


class ServerSampler:
    """Samples one upstream; `call_started` / `call_ended` (from the recorder) mark run boundaries."""

    def __init__(self, settings: GatewaySettings, writer: EventWriter) -> None:
        self.base = settings.upstream.rstrip("/")
        self.upstream = _without_credentials(settings.upstream)
        self.interval_s = settings.server_sample_s
        self.timeout_s = settings.server_sample_timeout_s
        self.tls = tls_context(settings) if self.base.startswith("https://") else None
        """The proxy's TLS rules for an `https://` upstream (its CAs, `LEDGER_UPSTREAM_CA_FILE`)."""
        self.writer = writer
        self.enabled = self.interval_s > 0
        self._triggers: asyncio.Queue[tuple[SampleTrigger, str | None]] = asyncio.Queue()
        self._runs_seen: set[str] = set()
        self._run_of: dict[str, str] = {}
        self._in_flight: Counter[str] = Counter()
        self._end_timers: dict[str, asyncio.TimerHandle] = {}
        self._config: dict[str, str] | None = None
        self._models: list[ServedModel] | None = None
        self._problem: str | None = None
        self._off = False
        self.ready = asyncio.Event()
        """Set once the start sample is taken (or failed, or sampling is off): the gateway listens after it,
        so that the first run has a sample before its first call."""

    # -- run boundaries (called on the proxy's path: bookkeeping only) -----------------------------
    def call_started(self, call_id: str, run: str | None) -> None:
        if not self.enabled or run is None:
            return
        self._run_of[call_id] = run
        self._in_flight[run] += 1
        timer = self._end_timers.pop(run, None)
        if timer is not None:
            timer.cancel()
        if run not in self._runs_seen:
            self._runs_seen.add(run)
            self._triggers.put_nowait(("run_start", run))

    def call_ended(self, call_id: str) -> None:
        run = self._run_of.pop(call_id, None)
        if run is None:
            return
        self._in_flight[run] -= 1
        if self._in_flight[run] <= 0:
            del self._in_flight[run]
            loop = asyncio.get_running_loop()
            self._end_timers[run] = loop.call_later(RUN_END_DELAY_S, self._run_ended, run)

    def _run_ended(self, run: str) -> None:
        self._end_timers.pop(run, None)
        self._triggers.put_nowait(("run_end", run))

    # -- the loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        """Sample until cancelled, or until the upstream turns out to have no `/metrics`."""
        if not self.enabled:
            self.ready.set()
            return
        async with self._client() as client:
            trigger: SampleTrigger = "start"
            run: str | None = None
            while await self._sample(client, trigger, run):
                self.ready.set()
                trigger, run = "interval", None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        trigger, run = await self._triggers.get()
        self.ready.set()
        for timer in self._end_timers.values():
            timer.cancel()

    async def last_sample(self) -> None:
        """At shutdown, once the last calls are done: one more sample, so the last run has its closing one."""
        if self.enabled and not self._off:
            async with self._client() as client:
                await self._sample(client, "stop", None)

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        verify: ssl.SSLContext | bool = self.tls or True
        return httpx.AsyncClient(timeout=self.timeout_s, limits=limits, trust_env=False, verify=verify)

    async def _sample(self, client: httpx.AsyncClient, trigger: SampleTrigger, run: str | None) -> bool:
        """One sample; False once the upstream has no `/metrics` (sampling stops)."""
        requested_at = utc_now()
        try:
            response = await client.get(self.base + "/metrics")
            sampled_at = utc_now()
            if response.status_code == 404:
                log.info("server_sampling_off", upstream=self.upstream, reason="the upstream has no /metrics")
                self._off = True
                return False
            if response.status_code != 200:
                raise MetricsUnreadable(f"/metrics answered {response.status_code}")
            parsed = await asyncio.to_thread(parse_metrics, response.text)  # pure-Python parsing, off the loop
            models = await self._served_models(client)
        except (httpx.HTTPError, MetricsUnreadable) as exc:
            self._warn(f"{type(exc).__name__}: {exc}")
            return True
        self._warn(None)
        config = parsed.config if parsed.config != self._config else None
        self._config = parsed.config or self._config
        changed_models = models if models is not None and models != self._models else None
        self._models = models if models is not None else self._models
        event = ServerSampled(
            upstream=self.upstream,
            sampled_at=sampled_at,
            requested_at=requested_at,
            trigger=trigger,
            run=run,
            counters=parsed.counters,
            gauges=parsed.gauges,
            accepted_per_pos=parsed.accepted_per_pos,
            config=config,
            models=changed_models,
        )
        self.writer.submit([new_event(event, stream=SERVER_STREAM)], None).add_done_callback(_check)
        return True

    async def _served_models(self, client: httpx.AsyncClient) -> list[ServedModel] | None:
        """The upstream's `/v1/models` (None when it has none or it is unreadable: not worth a warning)."""
        with contextlib.suppress(httpx.HTTPError, msgspec.ValidationError, msgspec.DecodeError):
            response = await client.get(self.base + "/v1/models")
            if response.status_code == 200:
                return msgspec.json.decode(response.content, type=_Models).data
        return None

    def _warn(self, problem: str | None) -> None:
        """Log a sampling problem once when it appears (and once when it clears), not every interval."""
        if problem == self._problem:
            return
        if problem is None:
            log.info("server_sampling_resumed", upstream=self.upstream)
        else:
            log.warning("server_sample_failed", upstream=self.upstream, error=problem)
        self._problem = problem


def _check(future: asyncio.Future[Durable]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.warning("server_sample_not_recorded", error=str(exc))
