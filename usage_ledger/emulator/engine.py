"""The engine loop: runs the scheduler against a virtual clock running `speed` times real time.

The clock maps real (monotonic) time to emulated epoch seconds. While busy, the engine sleeps
until each step's emulated end; when it falls behind by more than `_MAX_LAG_REAL_S` of real
time (CPU-bound at a high speed), the clock is re-anchored so emulated time slows down rather
than skipping: every timing the emulator reports stays consistent with the step-time model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import msgspec

from usage_ledger.emulator.cache_config import cache_config_labels
from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.metrics import Metrics
from usage_ledger.emulator.scheduler import Scheduler, Sequence

__all__ = ("Engine", "RequestRecord")

_MAX_LAG_REAL_S = 0.02
_MIN_SLEEP_REAL_S = 0.001
_YIELD_EVERY_S = 0.002
_YIELD_EVERY_VIRTUAL_S = 0.02


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One finished request, in emulated epoch seconds (served at `GET /emulator/requests`)."""

    request_id: str
    arrival: float
    first_token_at: float | None
    finished_at: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class Engine:
    def __init__(self, config: EmulatorConfig):
        self.config = config
        self.scheduler = Scheduler(config)
        self.metrics = Metrics(
            config.model, config.spec_tokens, created=time.time(), cache_config=cache_config_labels(config)
        )
        self.records: deque[RequestRecord] = deque(maxlen=config.max_request_log)
        self._speed = config.speed
        self._anchor_real = time.monotonic()
        self._anchor_virtual = time.time()
        self._busy = False
        self._step_start = 0.0
        self._step_end = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # -- clock ---------------------------------------------------------------------------
    def _wall(self) -> float:
        return self._anchor_virtual + (time.monotonic() - self._anchor_real) * self._speed

    def now(self) -> float:
        """Emulated epoch seconds, consistent with the engine's steps."""
        wall = self._wall()
        if self._busy:
            return min(max(wall, self._step_start), self._step_end)
        return wall

    def _reanchor(self, virtual: float) -> None:
        self._anchor_real = time.monotonic()
        self._anchor_virtual = virtual

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._reanchor(time.time())
            self._task = asyncio.get_running_loop().create_task(self._run(), name="emulator-engine")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def submit(self, seq: Sequence) -> None:
        self.scheduler.add(seq)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def abort(self, seq: Sequence) -> None:
        if seq.done:
            return
        self.scheduler.abort(seq)
        self.metrics.success["abort"] += 1
        self._record(seq, self.now(), "abort")

    def _record(self, seq: Sequence, at: float, reason: str) -> None:
        self.records.append(
            RequestRecord(
                request_id=seq.request_id,
                arrival=seq.arrival,
                first_token_at=seq.first_token_at,
                finished_at=at,
                prompt_tokens=seq.prompt_tokens,
                completion_tokens=seq.generated,
                finish_reason=reason,
            )
        )

    def render_metrics(self) -> str:
        return self.metrics.render(self.scheduler)

    # -- the step loop -------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sched = self.scheduler
        metrics = self.metrics
        speed = self._speed
        max_lag = _MAX_LAG_REAL_S * speed
        last_yield = time.monotonic()
        last_yield_virtual = 0.0
        # at moderate speeds keep client turn-arounds short in emulated time; at extreme ones, batch
        yield_virtual = _YIELD_EVERY_VIRTUAL_S * max(1.0, speed / 1000.0)
        while True:
            if not sched.has_work:
                if self._busy:
                    self._busy = False
                    if self._wall() < self._step_end:
                        self._reanchor(self._step_end)
                self._wake = loop.create_future()
                await self._wake
                self._wake = None
                continue
            if not self._busy:
                self._busy = True
                self._step_end = self._wall()
            plan = sched.schedule()
            if plan is None:  # pragma: no cover - has_work guarantees a plan
                await asyncio.sleep(0)
                continue
            t_start = self._step_end
            t_end = t_start + plan.dt
            self._step_start, self._step_end = t_start, t_end
            ahead = (t_end - self._wall()) / speed
            if ahead > 0:  # a sleep too short to time is a bare yield
                await asyncio.sleep(ahead if ahead > _MIN_SLEEP_REAL_S else 0)
                last_yield = time.monotonic()
            else:
                # Behind real time (CPU-bound): run steps back to back, yielding about once per
                # `_YIELD_EVERY_S` so handlers send several steps' events in one write.
                real = time.monotonic()
                if real - last_yield > _YIELD_EVERY_S or t_end - last_yield_virtual > yield_virtual:
                    await asyncio.sleep(0)
                    last_yield = time.monotonic()
                    last_yield_virtual = t_end
                if self._wall() - t_end > max_lag:
                    self._reanchor(t_end)
            touched = sched.complete(plan, t_end)
            emitted = 0
            for seq, _chunk in plan.prefills:
                if not seq.aborted and seq.computed >= seq.prompt_tokens and seq.first_token_at == t_end:
                    metrics.prompt_tokens += seq.prompt_tokens
                    metrics.ttft.observe(t_end - seq.arrival)
            n_decoding = 0
            for seq in touched:
                emitted += seq.pending[-1]
                if seq.first_token_at != t_end:
                    n_decoding += 1
                if seq.done:
                    metrics.success[seq.finish_reason] += 1
                    metrics.e2e.observe(t_end - seq.arrival)
                    self._record(seq, t_end, seq.finish_reason)
                waiter = seq.waiter
                if waiter is not None:
                    seq.waiter = None
                    if not waiter.done():
                        waiter.set_result(None)
            metrics.generation_tokens += emitted
            if n_decoding:
                metrics.itl.observe(plan.dt, n_decoding)
