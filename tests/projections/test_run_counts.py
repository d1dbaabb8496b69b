"""What a figure rests on (issue #53 points 2 and 3): a run where every call failed enters no throughput
mean, and eras and decide say how many runs each mean rests on; a partial replay counts a ticker by its
calls done and says it is partial."""

from __future__ import annotations

import asyncio
from zoneinfo import ZoneInfo

import pytest

from tests.projections.helpers import append, finished, started
from usage_ledger.answers.decide import decide
from usage_ledger.answers.eras import eras_report
from usage_ledger.answers.reports import runs_report
from usage_ledger.cli import main
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import NewEvent, RunAnnotated, new_event
from usage_ledger.projections.annotations import REPLAY_LABEL

UTC = ZoneInfo("UTC")


def run_calls(run: str, t0: float, tickers: dict[str, int], *, status: int = 200, length: float = 10) -> list[NewEvent]:
    """`tickers[k]` calls for each ticker k, one after another from t0, each `length` s and 100 output tokens."""
    out: list[NewEvent] = []
    t = t0
    for ticker, count in tickers.items():
        for i in range(count):
            call = f"{run}-{ticker}-{i}"
            out.append(started(call, t, run=run, ticker=ticker, model="dense"))
            completion = 100 if status == 200 else 0
            out.append(finished(call, t, t + length, status=status, completion=completion))
            t += length
    return out


async def test_a_run_where_every_call_failed_enters_no_mean(database: Database) -> None:
    await append(
        database,
        *run_calls("ok-1", 0, {"A": 2}),  # 200 tokens in 20 s: 10 tok/s
        *run_calls("ok-2", 100, {"A": 2}, length=5),  # 200 tokens in 10 s: 20 tok/s
        *run_calls("all-404", 200, {"A": 6}, status=404),
        *run_calls("b-1", 300, {"A": 2}),
    )
    rows = {r.run: r for r in await runs_report(database)}
    assert rows["all-404"].throughput_tps is None and rows["all-404"].hours_per_100_tickers is None
    for formula in ("batch_aggregate", "per_call_mean"):
        (era,) = [e for e in await eras_report(database, by="model", formula=formula, zone=UTC) if e.group == "dense"]
        assert (era.runs, era.measured_runs, era.left_out) == (4, 3, {"no completed call": 1})
        assert era.mean_throughput_tps == pytest.approx((10 + 20 + 10) / 3)
        assert era.min_throughput_tps == pytest.approx(10)
    result = await decide(database, ["ok-1", "ok-2", "all-404"], ["b-1"], "Buy,Hold,Sell")
    assert result.a.measured_runs == 2 and result.a.left_out == {"all-404": "no completed call"}
    assert result.a.throughput_tps == pytest.approx(15)
    assert result.a.hours_per_100_tickers == pytest.approx((20 + 10) / 2 / 3600 * 100)
    assert result.b.measured_runs == 1 and result.b.left_out == {}


async def test_a_partial_replay_counts_tickers_by_calls_done(database: Database) -> None:
    note = RunAnnotated(labels={REPLAY_LABEL: "orig"}, run="part")
    whole = RunAnnotated(labels={REPLAY_LABEL: "orig"}, run="again")
    await append(
        database,
        *run_calls("orig", 0, {"A": 4, "B": 4, "C": 4}),
        *run_calls("part", 1000, {"A": 2, "B": 1}),  # `replay --limit 3`: 2 of A's 4 calls, 1 of B's
        *run_calls("again", 2000, {"A": 4, "B": 4, "C": 4}),
        new_event(note, stream="run-part"),
        new_event(whole, stream="run-again"),
    )
    rows = {r.run: r for r in await runs_report(database)}
    part = rows["part"]
    assert part.partial is True and part.tickers == 2
    assert part.tickers_done == pytest.approx(2 / 4 + 1 / 4)
    assert part.hours_per_100_tickers == pytest.approx(30 / 3600 * 100 / 0.75)
    assert rows["orig"].hours_per_100_tickers == pytest.approx(120 / 3600 * 100 / 3)  # ratio 1.0: same pace
    again = rows["again"]
    assert again.partial is False and again.tickers_done == 3
    assert again.hours_per_100_tickers == rows["orig"].hours_per_100_tickers
    (alone,) = await runs_report(database, run="part")  # one run asked for: the run it replays is still read
    assert alone.tickers_done == part.tickers_done and alone.partial


def test_the_runs_table_says_which_run_is_partial_or_failed(
    backend_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--db", backend_url]) == 0

    async def seed() -> None:
        database = open_database(backend_url, null_pool=True)
        try:
            note = RunAnnotated(labels={REPLAY_LABEL: "orig"}, run="part")
            await append(
                database,
                *run_calls("orig", 0, {"A": 4, "B": 4}),
                *run_calls("part", 1000, {"A": 2}),
                *run_calls("all-404", 2000, {"A": 3}, status=404),
                new_event(note, stream="run-part"),
            )
        finally:
            await database.dispose()

    asyncio.run(seed())
    capsys.readouterr()
    assert main(["report", "runs", "--db", backend_url]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "part: partial, fewer calls than the run it replays; h/100 tickers count 0.50 tickers" in out
    assert "all-404: no completed call: no tok/s, in no mean" in out
