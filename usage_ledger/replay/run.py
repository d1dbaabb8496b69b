"""`ledger replay RUN --upstream URL`: a recorded run's requests sent again to another server, as a new run.

    plan_replay (replay.plan)   the run's requests in start order; calls without a body are skipped
    check_upstream              GET /v1/models answers with a model list, or exit 2 having sent nothing;
    check_models                without --model, the recorded models are among those listed, or exit 2
    recording_gateway           the real gateway, in-process, in front of --upstream (replay.gateway)
    _drive                      httpx → that gateway, at most `concurrency` at once, dispatched in the
                                original start order, tagged X-Ledger-Run NEW + the original tags
    run.annotated               replay_of=RUN on the new run
    compare_replay              RUN and NEW side by side (answers.compare), caught up first

Pacing, Ctrl-C, the deadline, an upstream that dies mid-replay and the call timeout behave as
docs/decide.md ("Replay") says; `UNREACHABLE_STREAK` is the unreachable streak that stops it.

It lives in the composition root, not in `gateway/` (DESIGN §9's first proposal): it reads the
calls projection (a run's calls, their tags after `call.retagged`) and prints a projections
report, and only the composition may know both packages (tests/test_layering.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from usage_ledger.answers import Comparison, calls_page, compare_runs
from usage_ledger.gateway import MAX_HEADER_VALUE, GatewaySettings
from usage_ledger.ledger import (
    ConfigError,
    Database,
    RunAnnotated,
    StorageSettings,
    append_events,
    new_event,
    wait_up_to,
)
from usage_ledger.projections import REPLAY_LABEL, NotFound, catch_up_all
from usage_ledger.replay.gateway import RecordingGateway, recording_gateway
from usage_ledger.replay.plan import ReplayPlan, ReplayRequest, load_body, plan_replay
from usage_ledger.replay.upstream import check_models, check_upstream

__all__ = ("DEFAULT_DEADLINE_S", "ReplayOptions", "ReplayResult", "compare_replay", "describe", "replay_run")

DEFAULT_DEADLINE_S = 24 * 3600.0
"""A bound on the whole replay: the seed's dense run took 6 h 18 min (DESIGN §7); a day is ample."""
CHECK_TIMEOUT_S = 30.0
"""The most `GET /v1/models` may take (less when the deadline or the call timeout is shorter)."""
UNREACHABLE_STREAK = 5
"""Calls in a row that found the upstream unreachable before the replay stops sending: a few, so a dead
server costs a handful of recorded failures instead of the rest of the run (71 of 80 in issue #53)."""
UNREACHABLE = "upstream_unreachable"
"""The gateway's error code for a connection the upstream refused or dropped before answering (gateway.errors)."""
RESET = "upstream_reset"
"""A call the upstream dropped mid-answer: what the calls in flight get when it dies, so it neither counts
towards the streak nor ends it."""


class ReplayOptions(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    upstream: str
    model: str | None = None
    concurrency: int | None = None
    """None: the most calls `run` had in flight."""
    new_run: str | None = None
    """None: `RUN-replay-<n>`, the first n not taken."""
    limit: int | None = None
    deadline_s: float = DEFAULT_DEADLINE_S
    """The most the replay may take, from its start; then it stops as on Ctrl-C."""
    call_timeout_s: float | None = None
    """Seconds without a byte from the upstream that fail a call (None: LEDGER_UPSTREAM_READ_TIMEOUT_S)."""


class ReplayResult(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    new_run: str
    concurrency: int
    calls: int
    """Calls of `run` examined."""
    skipped: dict[str, int]
    sent: int
    answered_ok: int
    """Answered with a 2xx status."""
    answered_error: int
    """Answered with another status (the upstream's error, passed through and recorded)."""
    not_answered: int
    """Transport errors and calls cancelled by a stop."""
    not_sent: int
    """Left when the replay was stopped."""
    interrupted: bool
    """Stopped by Ctrl-C (`stop`)."""
    deadline_reached: bool = False
    upstream_lost: bool = False
    """Stopped after `UNREACHABLE_STREAK` calls in a row found the upstream unreachable."""


def _tag_headers(run: str, tags: dict[str, str]) -> list[tuple[str, str]]:
    headers = [("X-Ledger-Run", run)]
    for name, value in sorted(tags.items()):
        headers.append(("X-Ledger-Ticker", value) if name == "ticker" else (f"X-Ledger-Tag-{name}", value))
    return headers


async def _has_calls(database: Database, run: str, run_gap_s: float) -> bool:
    try:
        await calls_page(database, run=run, limit=1, run_gap_s=run_gap_s, refresh=False)  # caught up by the plan
    except NotFound:
        return False
    return True


async def _new_run_name(database: Database, options: ReplayOptions, run_gap_s: float) -> str:
    """`--as`, which must be a new run (calls mixed into an existing run would blur both), or `RUN-replay-<n>`."""
    if options.new_run is not None:
        if await _has_calls(database, options.new_run, run_gap_s):
            raise ConfigError(f"--as {options.new_run!r}: that run already has calls; choose a new name")
        name = options.new_run
    else:
        n = 1
        while await _has_calls(database, f"{options.run}-replay-{n}", run_gap_s):
            n += 1
        name = f"{options.run}-replay-{n}"
    if len(name) > MAX_HEADER_VALUE or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ConfigError(
            f"run name {name[:40]!r}…: at most {MAX_HEADER_VALUE} printable characters; give one with --as"
        )
    return name


async def replay_run(
    database: Database,
    options: ReplayOptions,
    *,
    gateway_settings: GatewaySettings,
    storage: StorageSettings,
    run_gap_s: float,
    console: Console,
    stop: asyncio.Event | None = None,
) -> ReplayResult:
    """Replay `options.run` into a new run of `database` through a gateway with `gateway_settings` (its
    upstream and read timeout replaced by the options') spooling under `storage`; `run_gap_s` splits
    untagged runs. `stop` ends it early (Ctrl-C), as does the deadline."""
    loop = asyncio.get_running_loop()
    deadline_at = loop.time() + options.deadline_s
    plan = await plan_replay(database, options.run, limit=options.limit, model=options.model, run_gap_s=run_gap_s)
    if not plan.requests:
        raise ConfigError(f"run {options.run!r}: nothing to replay, {_skips(plan.skipped, plan.calls)}")
    new_run = await _new_run_name(database, options, run_gap_s)
    concurrency = options.concurrency or plan.max_in_flight
    call_timeout_s = options.call_timeout_s or gateway_settings.upstream_read_timeout_s
    check_timeout_s = max(0.1, min(CHECK_TIMEOUT_S, call_timeout_s, deadline_at - loop.time()))
    served = await check_upstream(options.upstream, timeout_s=check_timeout_s)
    if options.model is None:
        check_models(options.upstream, served, (request.model for request in plan.requests))
    stop = stop or asyncio.Event()
    halt = _Halt(stop, deadline_at)
    replaying = msgspec.structs.replace(
        gateway_settings, upstream=options.upstream, upstream_read_timeout_s=call_timeout_s
    )
    async with recording_gateway(replaying, storage, database) as gateway:
        tally = await _drive(database, gateway, plan, new_run, concurrency, options.model, halt, console)
    if tally.sent:
        note = RunAnnotated(labels={REPLAY_LABEL: options.run}, run=new_run)
        await append_events(database, [new_event(note, stream=f"run-{new_run}")])
    return ReplayResult(
        run=options.run,
        new_run=new_run,
        concurrency=concurrency,
        calls=plan.calls,
        skipped=dict(Counter(plan.skipped) + tally.skipped_late),
        sent=tally.sent,
        answered_ok=tally.ok,
        answered_error=tally.error,
        not_answered=tally.sent - tally.ok - tally.error,
        not_sent=len(plan.requests) - tally.sent - tally.skipped_late.total(),
        interrupted=stop.is_set(),
        deadline_reached=halt.deadline_reached,
        upstream_lost=halt.upstream_lost,
    )


class _Halt:
    """Ctrl-C (`stop`) or the deadline, whichever comes first; and whether the upstream was lost (the
    dispatching ends, the calls in flight are waited for: they fail fast, or succeed if it came back)."""

    def __init__(self, stop: asyncio.Event, deadline_at: float) -> None:
        self.stop = stop
        self.deadline_at = deadline_at
        self.deadline_reached = False
        self.upstream_lost = False
        self._unreachable = 0

    def answered(self, code: str | None) -> None:
        """One call's outcome (the gateway's error code, if any): `UNREACHABLE_STREAK` unreachable ones in a
        row stop the dispatching; an answer ends the streak, a reset leaves it as it is."""
        if code != RESET:
            self._unreachable = self._unreachable + 1 if code == UNREACHABLE else 0
        self.upstream_lost = self.upstream_lost or self._unreachable >= UNREACHABLE_STREAK

    def is_set(self) -> bool:
        if not self.stop.is_set() and asyncio.get_running_loop().time() >= self.deadline_at:
            self.deadline_reached = True
        return self.stop.is_set() or self.deadline_reached

    async def wait(self) -> None:
        remaining = self.deadline_at - asyncio.get_running_loop().time()
        if not await wait_up_to(self.stop.wait(), max(0.0, remaining)):
            self.deadline_reached = True


class _Code(msgspec.Struct):
    code: object = None


class _GatewayError(msgspec.Struct):
    error: _Code


class _Tally:
    def __init__(self) -> None:
        self.sent = 0
        self.ok = 0
        self.error = 0
        self.skipped_late: Counter[str] = Counter()


async def _drive(
    database: Database,
    gateway: RecordingGateway,
    plan: ReplayPlan,
    new_run: str,
    concurrency: int,
    model: str | None,
    stop: _Halt,
    console: Console,
) -> _Tally:
    """Dispatch in start order, `concurrency` at once, until done or `stop` (Ctrl-C or the deadline)."""
    tally = _Tally()
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(10.0, read=None)  # the gateway times the upstream out (LEDGER_UPSTREAM_READ_TIMEOUT_S)
    started = time.monotonic()
    tokens_at_start = gateway.metrics.completion_tokens
    with _progress(console) as bar:
        task = bar.add_task(f"replay {plan.run} → {new_run}", total=len(plan.requests), tps="")

        def finished() -> None:
            tokens = gateway.metrics.completion_tokens - tokens_at_start
            elapsed = time.monotonic() - started
            bar.update(task, advance=1, tps=f"{tokens / elapsed:,.0f} tok/s" if elapsed > 0 else "")

        async with httpx.AsyncClient(base_url=gateway.url, limits=limits, timeout=timeout, trust_env=False) as http:

            async def send(request: ReplayRequest, body: bytes) -> None:
                try:
                    response, code = await _send(http, request, body, new_run)
                    tally.ok += 200 <= response < 300
                    tally.error += not 200 <= response < 300
                    stop.answered(code)
                except httpx.HTTPError:
                    pass  # recorded by the gateway (e.g. upstream reset); counted as not answered
                finally:
                    slots.release()
                    finished()

            stopping = asyncio.create_task(stop.wait())
            try:
                for request in plan.requests:
                    acquiring = asyncio.create_task(slots.acquire())
                    await asyncio.wait((acquiring, stopping), return_when=asyncio.FIRST_COMPLETED)
                    if stop.is_set():
                        if acquiring.done() and not acquiring.cancelled():
                            slots.release()
                        acquiring.cancel()
                        break
                    if stop.upstream_lost:
                        slots.release()
                        break
                    body = await load_body(database, request, model)
                    if isinstance(body, str):  # redacted since the plan was made
                        tally.skipped_late[body] += 1
                        slots.release()
                        finished()
                        continue
                    tally.sent += 1
                    job = asyncio.create_task(send(request, body))
                    running.add(job)
                    job.add_done_callback(running.discard)
                while running and not stop.is_set():
                    await asyncio.wait((*running, stopping), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                for job in running:
                    job.cancel()  # the gateway sees the client leave and records the call so
                if running:
                    await asyncio.wait(running)
    return tally


async def _send(http: httpx.AsyncClient, request: ReplayRequest, body: bytes, new_run: str) -> tuple[int, str | None]:
    """One request: its status, and the gateway's error code for a 502 it answered itself. The response is
    read to its end (a stream's last bytes) and dropped."""
    headers = [*request.headers, *_tag_headers(new_run, request.tags)]
    url = request.path + ("?" + request.query if request.query else "")
    async with http.stream(request.method, url, content=body, headers=headers) as response:
        if response.status_code != 502:
            async for _ in response.aiter_raw():
                pass
            return response.status_code, None
        answer = await response.aread()  # an error body, small
    try:
        code = msgspec.json.decode(answer, type=_GatewayError).error.code
    except msgspec.DecodeError:  # the upstream's own 502, passed through
        code = None
    return response.status_code, code if isinstance(code, str) else None


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("calls"),
        TextColumn("{task.fields[tps]}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _skips(skipped: dict[str, int], calls: int) -> str:
    if not skipped:
        return f"none of its {calls} calls skipped"
    reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items(), key=lambda kv: -kv[1]))
    return f"{sum(skipped.values())} of its {calls} calls skipped ({reasons})"


def describe(result: ReplayResult, upstream: str, *, failed: int = 0, deadline_s: float | None = None) -> str:
    """The summary line printed last; `failed`: the new run's failed calls, as the ledger counts them."""
    head = "stopped: " if result.interrupted else ""
    if result.deadline_reached:
        head = f"deadline of {deadline_s:g} s reached: " if deadline_s is not None else "deadline reached: "
    elif result.upstream_lost:
        head = f"stopped, {upstream} unreachable for {UNREACHABLE_STREAK} calls in a row: "
    text = (
        f"{head}replayed {result.sent} requests of run {result.run} to {upstream} as run {result.new_run} "
        f"({result.concurrency} at once); {_skips(result.skipped, result.calls)}; "
        f"{result.answered_ok} answered 2xx, {result.answered_error} with an error status"
    )
    if result.not_answered:
        text += f", {result.not_answered} without an answer"
    if result.not_sent:
        text += f", {result.not_sent} not sent"
    if failed:
        text += f"; {failed} of {result.sent} calls failed (ledger export --run {result.new_run} --status error,failed)"
    return text


async def compare_replay(database: Database, result: ReplayResult, run_gap_s: float) -> tuple[Comparison, int]:
    """The replayed run and the new one side by side (`ledger compare`, read models caught up first), and
    the new run's failed calls as the reports count them."""
    await catch_up_all(database)
    comparison = await compare_runs(database, [result.run, result.new_run], run_gap_s=run_gap_s)
    return comparison, next(r.failed_calls for r in comparison.runs if r.run == result.new_run)
