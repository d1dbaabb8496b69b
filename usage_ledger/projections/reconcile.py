"""Reconciliation windows: the server's counters between two idle samples against every recorded call between
them (docs/server.md). Idle samples, because a sample taken while a call was in flight splits that call
between the two sides in a way the ledger cannot know."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from datetime import datetime

import msgspec

from usage_ledger.ledger import ServerSampled

__all__ = ("Reconciliation", "RunSpan", "ServerTraffic", "WindowCheck", "counter_deltas")

REQUESTS = "vllm:request_success_total"
PROMPT = "vllm:prompt_tokens_total"
GENERATION = "vllm:generation_tokens_total"


class Reconciliation(msgspec.Struct, frozen=True, kw_only=True):
    """Server minus ledger, per quantity: > 0 reached the server without passing through this gateway."""

    requests: int
    prompt_tokens: int
    generation_tokens: int


class RunSpan(msgspec.Struct, frozen=True, kw_only=True):
    """A run's recorded calls as a server counts them: one request per completed call, every call's tokens."""

    run: str
    started_at: datetime
    ended_at: datetime
    requests: int
    prompt_tokens: int
    generation_tokens: int


class WindowCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One run's reconciliation window; `reconciled` None with `problem` saying why it could not be checked."""

    shared_with: list[str] = []
    """The other runs with calls in the window: checked together with this one."""
    reconciled: bool | None = None
    difference: Reconciliation | None = None
    server_requests: int | None = None
    server_prompt_tokens: int | None = None
    server_generation_tokens: int | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    samples: int = 0
    problem: str | None = None


def counter_deltas(window: Sequence[ServerSampled]) -> tuple[dict[str, float], int]:
    """Per counter, the sum of its increases between consecutive samples; and the restarts seen."""
    totals: dict[str, float] = {}
    restarts = 0
    for before, after in itertools.pairwise(window):
        if any(after.counters.get(name, 0.0) < value for name, value in before.counters.items()):
            restarts += 1  # the server restarted between these two: this pair says nothing
            continue
        for name, value in after.counters.items():
            totals[name] = totals.get(name, 0.0) + value - before.counters.get(name, 0.0)
    return totals, restarts


def _requested(sample: ServerSampled) -> datetime:
    return sample.requested_at or sample.sampled_at


class _Upstream:
    """One server's samples, which of them are idle, and the recorded runs that went to it."""

    def __init__(self, samples: Sequence[ServerSampled], spans: Sequence[RunSpan], unplaced: Sequence[RunSpan]) -> None:
        self.samples = sorted(samples, key=lambda s: s.sampled_at)
        self.spans = sorted(spans, key=lambda s: s.started_at)
        self.unplaced = unplaced
        busy = _merged((s.started_at, s.ended_at) for s in (*spans, *unplaced))
        starts = [start for start, _ in busy]

        def idle(sample: ServerSampled) -> bool:
            i = bisect.bisect_left(starts, sample.sampled_at) - 1  # the last busy stretch starting before the answer
            return i < 0 or busy[i][1] <= _requested(sample)

        self.idle = [i for i, s in enumerate(self.samples) if idle(s)]
        self.answered = [self.samples[i].sampled_at for i in self.idle]
        self.requested = [_requested(self.samples[i]) for i in self.idle]

    def check(self, span: RunSpan) -> WindowCheck:
        before = bisect.bisect_right(self.answered, span.started_at) - 1
        after = bisect.bisect_left(self.requested, span.ended_at)
        if before < 0 or after >= len(self.idle):
            side = "before" if before < 0 else "after"
            return WindowCheck(problem=f"no idle server sample {side} the run")
        first, last = self.idle[before], self.idle[after]
        window = self.samples[first : last + 1]
        start, end = window[0].sampled_at, _requested(window[-1])
        inside = [s for s in self.spans if start <= s.started_at and s.ended_at <= end]
        others = [s.run for s in inside if s.run != span.run]
        base = WindowCheck(
            shared_with=others, window_start=start, window_end=window[-1].sampled_at, samples=len(window)
        )
        stray = [s.run for s in self.unplaced if start <= s.started_at and s.ended_at <= end]
        if stray:
            problem = f"calls of {', '.join(stray)} in the window may have gone to this server (no sample names it)"
            return msgspec.structs.replace(base, problem=problem)
        deltas, restarts = counter_deltas(window)
        if restarts:
            return msgspec.structs.replace(base, problem=f"the server restarted {restarts}× inside the window")
        if any(name not in window[-1].counters for name in (REQUESTS, PROMPT, GENERATION)):
            return msgspec.structs.replace(base, problem="the server does not expose vLLM's request and token counters")
        requests, prompt, generation = (round(deltas.get(name, 0.0)) for name in (REQUESTS, PROMPT, GENERATION))
        difference = Reconciliation(
            requests=requests - sum(s.requests for s in inside),
            prompt_tokens=prompt - sum(s.prompt_tokens for s in inside),
            generation_tokens=generation - sum(s.generation_tokens for s in inside),
        )
        return msgspec.structs.replace(
            base,
            reconciled=difference == Reconciliation(requests=0, prompt_tokens=0, generation_tokens=0),
            difference=difference,
            server_requests=requests,
            server_prompt_tokens=prompt,
            server_generation_tokens=generation,
        )


def _merged(spans: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """Overlapping stretches joined: when at least one recorded call was in flight."""
    out: list[tuple[datetime, datetime]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class ServerTraffic:
    """Every server's samples and the recorded runs that went to each, built once for a report.

    A run goes to the server whose samples its calls triggered (`ServerSampled.run`); a run no sample
    names (untagged calls, sampling off) goes to the only server sampled, and counts against every
    server when there are several (their windows holding it cannot be checked).
    """

    def __init__(self, samples: Sequence[ServerSampled], spans: Sequence[RunSpan]) -> None:
        upstreams: dict[str, set[str]] = {}
        for sample in samples:
            if sample.run is not None:
                upstreams.setdefault(sample.run, set()).add(sample.upstream)
        servers = sorted({s.upstream for s in samples})
        placed: dict[str, list[RunSpan]] = {server: [] for server in servers}
        unplaced: list[RunSpan] = []
        for span in spans:
            named = upstreams.get(span.run) or (set(servers) if len(servers) == 1 else set())
            if len(named) == 1:
                placed[next(iter(named))].append(span)
            else:
                unplaced.append(span)
        self._upstream_of = {run: next(iter(named)) for run, named in upstreams.items() if len(named) == 1}
        self._single = servers[0] if len(servers) == 1 else None
        self._servers = {
            server: _Upstream([s for s in samples if s.upstream == server], placed[server], unplaced)
            for server in servers
        }
        self._spans = {span.run: span for span in spans}

    def check(self, run: str) -> WindowCheck | None:
        """The run's window check; None when no server was sampled or the run is not known."""
        span = self._spans.get(run)
        server = self._upstream_of.get(run, self._single)
        if span is None or server is None:
            return None
        return self._servers[server].check(span)
