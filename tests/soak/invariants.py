"""The soak's invariants over what the clients saw and what the ledger holds.

- lost: a call whose client got a 200 in full that is not finished in the ledger with exactly the
  client's bytes; or a call whose `X-Ledger-Call-Id` reached its client with no `call.started`;
- duplicated: an event id twice, a call started, finished or failed twice, or both finished and failed;
- stuck: a call started and never ended although no kill cut it (it began after the last kill), or a
  client left waiting past its read timeout (the soak adds projections or a spool that never catch up);
- tokens: a 200's reported usage equals the ledger's (`reported`), and the upstream's own count for
  that request (the emulator's `/emulator/requests`);
- unrecorded at the upstream: every call that reached the relay (its `x-soak-call` marker) has a `call.started`
  holding that marker, whatever its client saw (strict durability: the start is durable before the request goes
  upstream, so a 503 `ledger_unavailable` never reached it); for a spelled call (an encoded or ambiguous inference
  path) only when the emulator answered it as an inference API (not 307, 404 or 405); one the gateway refused with
  400 `non_canonical_path` never reached the relay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.reliability.helpers import read_blobs
from tests.soak.clients import Call, reported_usage
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted
from usage_ledger.ledger.read import iter_events

__all__ = ("LedgerScan", "Verdict", "judge")


@dataclass
class LedgerScan:
    """The ledger read so far (incrementally: each `advance` reads only the new events)."""

    after: int = 0
    events: int = 0
    event_ids: set[str] = field(default_factory=set)
    started: dict[str, CallStarted] = field(default_factory=dict)
    finished: dict[str, CallFinished] = field(default_factory=dict)
    failed: dict[str, CallFailed] = field(default_factory=dict)
    duplicated: list[str] = field(default_factory=list)

    async def advance(self, db_url: str) -> None:
        database = open_database(db_url, null_pool=True)
        try:
            async for stored in iter_events(database, self.after):
                self.after = stored.position
                self.events += 1
                event_id = str(stored.event_id)
                if event_id in self.event_ids:
                    self.duplicated.append(f"event {event_id} again at position {stored.position}")
                self.event_ids.add(event_id)
                self._note(stored.body(), stored.position)
        finally:
            await database.dispose()

    def _note(self, body: object, position: int) -> None:
        table: dict[str, CallStarted] | dict[str, CallFinished] | dict[str, CallFailed]
        if isinstance(body, CallStarted):
            table = self.started
        elif isinstance(body, CallFinished):
            table = self.finished
        elif isinstance(body, CallFailed):
            table = self.failed
        else:
            return
        if body.call_id in table:
            self.duplicated.append(f"{type(body).__name__} of {body.call_id} again at position {position}")
        if not isinstance(body, CallStarted) and body.call_id in (
            self.failed if table is self.finished else self.finished
        ):
            self.duplicated.append(f"{body.call_id} both finished and failed (position {position})")
        table[body.call_id] = body  # type: ignore[assignment]


@dataclass
class Verdict:
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)

    @property
    def violations(self) -> list[str]:
        return [*self.lost, *self.duplicated, *self.stuck, *self.tokens]


def whole_200(call: Call) -> bool:
    """The client got a 200 and every byte of it (a stream up to `[DONE]`)."""
    o = call.outcome
    return o.status == 200 and o.complete and o.error is None and o.call_id is not None


def _ended(scan: LedgerScan, call_id: str | None) -> CallFinished | CallFailed | None:
    return scan.finished.get(call_id or "") or scan.failed.get(call_id or "")


async def judge(
    db_url: str,
    calls: list[Call],
    scan: LedgerScan,
    kills: list[float],
    upstream: dict[str, tuple[int, int]],
    unrecorded: set[str],
    context: Callable[[Call], str],
    relayed: dict[str, int],
) -> Verdict:
    """`unrecorded`: the calls whose end the gateway logged as durable nowhere; `context` says what the
    client saw and which faults were running while a call ran."""
    verdict = Verdict(duplicated=list(scan.duplicated))
    whole = [c for c in calls if whole_200(c)]
    # a 200 in full ends in the ledger: finished, or failed for an error event inside its stream
    verdict.lost += [
        f"200 in full, not in the ledger: {context(c)}" for c in whole if _ended(scan, c.outcome.call_id) is None
    ]
    present = [(c, e) for c in whole if (e := _ended(scan, c.outcome.call_id)) is not None]
    blobs = await read_blobs(db_url, [e.response_blob for _, e in present if e.response_blob is not None])
    for call, end in present:
        if end.response_blob is None or blobs[end.response_blob] != call.outcome.body:
            verdict.lost.append(f"the ledger's body differs from the client's: {context(call)}")
    seen = [c for c in calls if c.outcome.call_id and c.outcome.call_id not in scan.started]
    verdict.lost += [f"its X-Ledger-Call-Id reached the client, no call.started: {context(c)}" for c in seen]

    # A call may stay open (started, never ended) when a kill cut it, or when its end was durable nowhere
    # (the gateway logged `call_record_failed` and cut the client off). Any other open call is stuck.
    last_kill = max(kills, default=0.0)
    ended = scan.finished.keys() | scan.failed.keys()
    open_calls = [s for s in scan.started.values() if s.call_id not in ended]
    cut_by_kill = [s for s in open_calls if s.received_at.timestamp() <= last_kill]
    end_unrecorded = [s for s in open_calls if s.received_at.timestamp() > last_kill and s.call_id in unrecorded]
    verdict.stuck += [
        f"stuck: {s.call_id} ({s.tags.get('ticker')}) started at {s.received_at}, never ended, no kill since"
        for s in open_calls
        if s.received_at.timestamp() > last_kill and s.call_id not in unrecorded
    ]
    verdict.stuck += [
        f"stuck: the client timed out: {context(c)}"
        for c in calls
        if "Timeout" in (c.outcome.error or "").split(":")[0]
    ]

    spelled = _spelled(calls, scan, relayed, verdict)
    reached_upstream = _unrecorded_at_upstream(scan, relayed, verdict)

    client_tokens = [0, 0]
    for call in whole:
        usage = reported_usage(call.outcome.body)
        finished = scan.finished.get(call.outcome.call_id)  # type: ignore[arg-type]
        if usage is None or finished is None:
            continue
        client_tokens[0] += usage[0]
        client_tokens[1] += usage[1]
        got = (finished.usage.prompt_tokens, finished.usage.completion_tokens) if finished.usage else None
        if got != usage or finished.usage_source != "reported":
            verdict.tokens.append(f"{call.outcome.call_id}: client {usage}, ledger {got} ({finished.usage_source})")
    all_tokens = [0, 0]  # every usage the ledger holds, as the reports add it up
    for end in [*scan.finished.values(), *scan.failed.values()]:
        if end.usage is not None:
            all_tokens = [all_tokens[0] + end.usage.prompt_tokens, all_tokens[1] + end.usage.completion_tokens]
    ledger_tokens, upstream_tokens, unmatched = [0, 0], [0, 0], 0
    for finished in scan.finished.values():
        if finished.usage_source != "reported" or finished.usage is None:
            continue
        mine = (finished.usage.prompt_tokens, finished.usage.completion_tokens)
        theirs = upstream.get(finished.upstream_request_id or "")  # vLLM's x-request-id: its ids without the prefix
        if theirs is None:
            unmatched += 1
            continue
        ledger_tokens = [ledger_tokens[0] + mine[0], ledger_tokens[1] + mine[1]]
        upstream_tokens = [upstream_tokens[0] + theirs[0], upstream_tokens[1] + theirs[1]]
        if mine != theirs:
            verdict.tokens.append(f"{finished.call_id}: ledger {mine}, upstream {theirs}")

    verdict.figures = {
        "calls": len(calls),
        "calls_by_kind": dict(sorted(Counter(c.kind for c in calls).items())),
        "whole_200": len(whole),
        "spelled": spelled,
        "reached_upstream_all_recorded": reached_upstream,
        "client_errors": sum(1 for c in calls if c.outcome.error),
        "ledger": {
            "events": scan.events,
            "started": len(scan.started),
            "finished": len(scan.finished),
            "failed": len(scan.failed),
            "open_cut_by_a_kill": len(cut_by_kill),
            "open_end_durable_nowhere": len(end_unrecorded),
            "failed_reasons": dict(sorted(Counter(f.reason for f in scan.failed.values()).items())),
        },
        "tokens": {
            "clients_prompt_completion": client_tokens,
            "ledger_reported_prompt_completion": ledger_tokens,
            "upstream_prompt_completion": upstream_tokens,
            "ledger_reported_not_in_upstream_log": unmatched,
            "ledger_all_prompt_completion": all_tokens,
        },
    }
    return verdict


_NOT_ROUTED = (307, 404, 405)  # the upstream's answers to a path it does not route to an inference API


def _unrecorded_at_upstream(scan: LedgerScan, relayed: dict[str, int], verdict: Verdict) -> int:
    """Every call the relay saw (an inference API at the emulator, for a spelling) is in the ledger: its count."""
    markers = {v for s in scan.started.values() for n, v in s.request_headers if n.lower() == "x-soak-call"}
    reached = [m for m, status in relayed.items() if not (m.startswith("spelled-") and status in _NOT_ROUTED)]
    verdict.lost += [
        f"{m} reached the upstream, the ledger has no call.started for it" for m in reached if m not in markers
    ]
    return len(reached)


def _spelled(calls: list[Call], scan: LedgerScan, relayed: dict[str, int], verdict: Verdict) -> dict[str, int]:
    """What became of the spelled calls: recorded, refused before the upstream, or no inference call there."""
    figures: Counter[str] = Counter()
    for call in calls:
        if call.spelling is None:
            continue
        o = call.outcome
        upstream = relayed.get(call.spelling)
        refused = o.status == 400 and b'"non_canonical_path"' in o.body
        if refused and upstream is not None:
            verdict.lost.append(f"{call.spelling}: refused 400 after it reached the upstream")
        figures[
            "recorded"
            if o.call_id is not None and o.call_id in scan.started
            else "refused_400"
            if refused
            else "not_an_inference_path"
            if upstream in _NOT_ROUTED
            else "other"  # no answer (a kill), or a 503 while the ledger was down
        ] += 1
    return dict(sorted(figures.items()))
