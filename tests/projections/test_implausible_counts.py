"""Absurd token counts in stored events (red team, round three): the fold keeps them out of every sum, says
`implausible`, and no reader fails, on both backends. Events are written as a ledger recorded before the rule
could hold them (the gateway and `ledger import` now say `implausible` themselves, `test_implausible_entry`)."""

from __future__ import annotations

import io
import itertools
from datetime import timedelta
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.projections.helpers import append, at, spec_metrics, started
from usage_ledger.answers.compare import compare_runs
from usage_ledger.answers.export import export_calls, show_call
from usage_ledger.answers.reports import daily_report, runs_report, tickers_report, weekday_mean
from usage_ledger.ledger.counts import MAX_CALL_TOKENS
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFinished, CallImported, NewEvent, Timings, Usage, new_event
from usage_ledger.projections.engine import catch_up_all

_serial = itertools.count()
_EXTREME: list[Any] = [0, 1, 1500, MAX_CALL_TOKENS, MAX_CALL_TOKENS + 1, 2**62, 2**63 - 1, 2**63, 2**64, 2**70, -1]
_count = st.one_of(st.sampled_from(_EXTREME), st.integers(0, 10**6))
_stored = st.one_of(_count, st.sampled_from([1e300, 2.5, -0.0, 1e19]))  # JSON numbers a forged payload may hold


def _plausible(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_CALL_TOKENS


class _Call(msgspec.Struct, frozen=True):
    prompt: Any
    completion: Any
    cached: Any
    imported: bool
    run: str


_calls = st.builds(
    _Call,
    prompt=_stored,
    completion=_stored,
    cached=st.none() | _stored,
    imported=st.booleans(),
    run=st.sampled_from(["a", "b"]),
)


def _events(call: _Call, i: int, salt: int) -> list[NewEvent]:
    cid = f"x{salt}-{i}"
    t0 = 10.0 * i
    if call.imported:
        body = CallImported(
            call_id=cid,
            source="f.jsonl",
            line=i + 1,
            started_at=at(t0),
            finished_at=at(t0) + timedelta(seconds=3),
            input_tokens=call.prompt,
            output_tokens=call.completion,
            run=f"{call.run}{salt}",
            tags={"ticker": "T"},
        )
        return [new_event(body, stream=f"call-{cid}", occurred_at=at(t0 + 3))]
    usage = Usage(
        prompt_tokens=call.prompt, completion_tokens=call.completion, total_tokens=0, cached_tokens=call.cached
    )
    metrics = spec_metrics(call.prompt, 1, 1) if type(call.prompt) is int and call.prompt >= 1 else None
    finished = CallFinished(
        call_id=cid,
        status=200,
        usage=usage,
        usage_source="reported",
        timings=Timings(received=at(t0), first_token=at(t0 + 0.5), last_token=at(t0 + 2), finished=at(t0 + 3)),
        request_metrics=metrics,
    )
    return [
        started(cid, t0, run=f"{call.run}{salt}", ticker="T"),
        new_event(finished, stream=f"call-{cid}", occurred_at=at(t0 + 3)),
    ]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(_calls, min_size=1, max_size=8))
async def test_absurd_counts_enter_no_sum_and_no_reader_fails(database: Database, batch: list[_Call]) -> None:
    salt = next(_serial)
    await append(database, *(e for i, call in enumerate(batch) for e in _events(call, i, salt)))
    await catch_up_all(database)

    lines = io.BytesIO()
    await export_calls(database, fmt="jsonl", stdout=lines)
    rows = {r["call_id"]: r for r in map(msgspec.json.decode, lines.getvalue().splitlines())}
    for i, call in enumerate(batch):
        row = rows[f"x{salt}-{i}"]
        plausible = _plausible(call.prompt) and _plausible(call.completion)
        if not call.imported:
            plausible = plausible and (call.cached is None or _plausible(call.cached))
        assert row["usage_source"] == ("implausible" if not plausible else "imported" if call.imported else "reported")
        assert row["input_tokens"] == (call.prompt if _plausible(call.prompt) else 0)
        assert row["output_tokens"] == (call.completion if _plausible(call.completion) else 0)
        if not call.imported:
            assert row["cached_tokens"] == (call.cached if _plausible(call.cached) else None)
        await show_call(database, row["call_id"])

    # the sums are over the plausible counts only, exact, on every report
    runs = {r.run: r for r in await runs_report(database) if r.run.endswith(str(salt))}
    tickers = {t.run: t for t in await tickers_report(database)}
    for name, run in runs.items():
        mine = [c for c in batch if f"{c.run}{salt}" == name]
        expected = (
            sum(c.prompt for c in mine if _plausible(c.prompt)),
            sum(c.completion for c in mine if _plausible(c.completion)),
        )
        assert (run.input_tokens, run.output_tokens) == expected
        assert (tickers[name].input_tokens, tickers[name].output_tokens) == expected
    weekday_mean(await daily_report(database))
    # compare reads whole events, whose counts are integers as the product writes them (floats: forged only)
    if len(runs) == 2 and not any(isinstance(v, float) for c in batch for v in (c.prompt, c.completion, c.cached)):
        await compare_runs(database, sorted(runs), refresh=False)
