"""The calls read model from gateway events: status, timings, speeds, in-flight, incomplete, retags."""

from __future__ import annotations

import pytest

from tests.projections.helpers import append, failed, finished, started
from usage_ledger.answers.callviews import calls_page, get_call, iter_calls
from usage_ledger.answers.reports import runs_report, tickers_report
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallRetagged, new_event
from usage_ledger.ledger.read import iter_events


async def test_gateway_call_row(database: Database) -> None:
    await append(
        database, started("a", 0, run="r1", ticker="AAPL"), finished("a", 0, 10.0, prompt=2000, completion=101)
    )
    call = await get_call(database, "a")
    assert (call.status, call.http_status, call.usage_source, call.run, call.ticker) == (
        "ok",
        200,
        "reported",
        "r1",
        "AAPL",
    )
    assert call.elapsed_s == pytest.approx(10.0)
    assert call.ttft_s == pytest.approx(0.5)
    assert call.prefill_tps == pytest.approx(2000 / 0.5)
    assert call.decode_tps == pytest.approx(100 / (9.9 - 0.5))
    assert call.in_flight == 1


async def test_incomplete_and_failed_are_counted(database: Database) -> None:
    await append(
        database,
        started("ok", 0, run="r"),
        finished("ok", 0, 5),
        started("gone", 1, run="r"),
        started("bad", 2, run="r"),
        failed("bad", 2, 3),
        started("err", 3, run="r"),
        finished("err", 3, 4, status=500, completion=0, prompt=0),
    )
    assert (await get_call(database, "gone")).status == "incomplete"
    assert (await get_call(database, "bad")).failure_reason == "upstream_unreachable"
    (row,) = await runs_report(database)
    assert (row.calls, row.failed_calls, row.incomplete_calls) == (4, 2, 1)
    assert row.wall_s == pytest.approx(5.0)


async def test_in_flight_sweep_matches_sql(database: Database) -> None:
    await append(
        database,
        started("a", 0),
        finished("a", 0, 10),
        started("b", 2),
        finished("b", 2, 4),
        started("c", 3),
        finished("c", 3, 12),
        started("d", 4),
        finished("d", 4, 5),
        started("e", 20),
        finished("e", 20, 21),
    )
    swept = {v.call_id: v.in_flight for v in [v async for v in iter_calls(database)]}
    assert swept == {"a": 1, "b": 2, "c": 3, "d": 3, "e": 1}
    page = await calls_page(database, limit=2)
    assert [v.call_id for v in page.items] == ["a", "b"] and page.next_offset == 2
    paged = {v.call_id: v.in_flight for v in (await calls_page(database, limit=10)).items}
    assert paged == swept


async def test_finish_before_start_is_kept(database: Database) -> None:
    await append(database, finished("x", 0, 2, completion=7))
    call = await get_call(database, "x")
    assert (call.status, call.output_tokens, call.started_at.second) == ("ok", 7, 0)


async def test_retag_changes_projection_not_history(database: Database) -> None:
    await append(database, started("a", 0, run="wrong", ticker="AAPL"), finished("a", 0, 5))
    retag = CallRetagged(call_id="a", reason="mislabelled", run="right", tags={"ticker": "MSFT", "k": "v"})
    await append(database, new_event(retag, stream="call-a"))
    call = await get_call(database, "a")
    assert (call.run, call.ticker, call.tags, call.retags) == ("right", "MSFT", {"ticker": "MSFT", "k": "v"}, 1)
    assert [r.run for r in await runs_report(database)] == ["right"]
    assert [(t.run, t.ticker) for t in await tickers_report(database)] == [("right", "MSFT")]
    history = [e.body() async for e in iter_events(database)]
    assert getattr(history[0], "run") == "wrong"  # noqa: B009 - the stored event is untouched


async def test_untagged_calls_grouped_by_gaps(database: Database) -> None:
    await append(
        database,
        started("a", 0),
        finished("a", 0, 100),
        started("b", 500),
        finished("b", 500, 600),  # gap 400 s < 900: same run
        started("c", 2000),
        finished("c", 2000, 2100),  # gap 1400 s: new run
        started("t", 50, run="tagged"),
        finished("t", 50, 60),
    )
    rows = await runs_report(database)
    assert [(r.run, r.calls) for r in rows] == [
        ("auto-2026-03-02T12:00:00Z", 2),
        ("tagged", 1),
        ("auto-2026-03-02T12:33:20Z", 1),
    ]
    only = await runs_report(database, run="auto-2026-03-02T12:00:00Z")
    assert only[0].output_tokens == 202
    exported = [v.call_id async for v in iter_calls(database, run="auto-2026-03-02T12:00:00Z")]
    assert exported == ["a", "b"]
    short = await runs_report(database, run_gap_s=300)
    assert len(short) == 4


async def test_a_call_without_a_decode_interval_has_no_rate_and_says_why(database: Database) -> None:
    one_read = finished("one-read", 0, 2, completion=300, ttft=1.9)  # first token = last token: one read
    await append(
        database, started("one-read", 0), one_read, started("one-token", 3), finished("one-token", 3, 4, completion=1)
    )
    call = await get_call(database, "one-read")
    assert call.decode_tps is None and call.decode_tps_note is not None and "one read" in call.decode_tps_note
    assert (await get_call(database, "one-token")).decode_tps_note == "at most one output token: no decode interval"
