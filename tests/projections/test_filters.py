"""`--since`, `--until`, `--model`, `--status` on `report` and `export` (the ledger of `fit_seed`)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tests.ledger.helpers import build_ledger
from tests.projections.fit_seed import AUTO_1, AUTO_2, seed_fit_ledger
from usage_ledger.answers.filters import InvalidFilter, parse_filter, parse_time
from usage_ledger.cli import main

SEOUL = ZoneInfo("Asia/Seoul")


@pytest.fixture
def db(backend_url: str) -> str:
    return asyncio.run(build_ledger(backend_url, seed_fit_ledger))


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    capsys.readouterr()
    assert main([*args, "--format", "json"]) == 0
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return rows


def _runs(capsys: pytest.CaptureFixture[str], db: str, *flags: str) -> dict[object, object]:
    return {r["run"]: r["calls"] for r in _json(capsys, "report", "runs", "--db", db, "--tz", "UTC", *flags)}


def test_times_are_local_dates_or_instants() -> None:
    assert parse_time("2026-03-02", "since", SEOUL) == datetime(2026, 3, 1, 15, tzinfo=UTC)
    assert parse_time("2026-03-02", "until", SEOUL, end=True) == datetime(2026, 3, 2, 15, tzinfo=UTC)
    assert parse_time("2026-03-02T09:30", "since", SEOUL) == datetime(2026, 3, 2, 0, 30, tzinfo=UTC)
    assert parse_time("2026-03-02T09:30+01:00", "since", SEOUL) == datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
    for bad in ("yesterday", "2026-13-01", "2026-03-02T25:00", "2026-02-30", "2026-04-31T09:00", "2026\x00"):
        with pytest.raises(InvalidFilter, match="expected an ISO date") as raised:
            parse_time(bad, "since", SEOUL)
        assert raised.value.parameter == "since"
    for day in ("2026-01-29", "2026-01-30", "2026-01-31", "2024-02-29"):  # real days past the 28th
        # the day's end is the next local midnight, 15:00 UTC of the day itself in Seoul
        assert parse_time(day, "until", SEOUL, end=True) == datetime.fromisoformat(f"{day}T15:00+00:00")
    # real moments whose UTC instant the calendar cannot hold bound nothing on their side
    assert parse_time("0001-01-01T00:00+01:00", "since", SEOUL) == datetime.min.replace(tzinfo=UTC)
    assert parse_time("0001-01-01", "since", SEOUL) == datetime.min.replace(tzinfo=UTC)
    assert parse_time("9999-12-31", "until", SEOUL, end=True) == datetime.max.replace(tzinfo=UTC)
    empty = parse_filter(zone=SEOUL, since="2026-03-03", until="2026-03-02")  # a range with no instant in it
    assert empty.since is not None and empty.until is not None and empty.since >= empty.until
    with pytest.raises(InvalidFilter, match="ok, error, failed, incomplete"):
        parse_filter(zone=SEOUL, status="ok,done")
    assert parse_filter(zone=SEOUL, status="failed, ok,failed").statuses == ("failed", "ok")


def test_report_runs_filters(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    everything = {"alpha": 3, "beta": 2, AUTO_1: 2, AUTO_2: 1}
    assert _runs(capsys, db) == everything
    assert _runs(capsys, db, "--model", "m2") == {"beta": 2}
    assert _runs(capsys, db, "--model", "m1") == {"alpha": 3, AUTO_1: 2, AUTO_2: 1}
    assert _runs(capsys, db, "--status", "failed") == {"alpha": 1}
    assert _runs(capsys, db, "--status", "error,failed") == {"alpha": 1, "beta": 1}
    assert _runs(capsys, db, "--until", "2026-03-02") == {"alpha": 3, "beta": 2}  # a bare date: through that day
    assert _runs(capsys, db, "--since", "2026-03-03") == {AUTO_1: 2, AUTO_2: 1}
    # an auto-… run keeps its name when a filter leaves out its first call
    assert _runs(capsys, db, "--since", "2026-03-03T12:01") == {AUTO_1: 1, AUTO_2: 1}
    assert _runs(capsys, db, "--since", "2026-03-02T12:00:05", "--until", "2026-03-02T12:00:06") == {"alpha": 1}


def test_naive_times_are_read_in_the_commands_zone(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    # 21:30 in Seoul is 12:30 UTC: after alpha, before beta
    seoul = _json(capsys, "report", "runs", "--db", db, "--tz", "Asia/Seoul", "--until", "2026-03-02T21:30")
    assert [r["run"] for r in seoul] == ["alpha"]
    utc = _json(capsys, "report", "runs", "--db", db, "--tz", "UTC", "--until", "2026-03-02T21:30")
    assert [r["run"] for r in utc] == ["alpha", "beta"]


def test_filtered_rows_hold_only_the_selected_calls(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    (alpha,) = _json(capsys, "report", "runs", "--db", db, "--run", "alpha", "--status", "ok")
    assert (alpha["calls"], alpha["failed_calls"], alpha["input_tokens"]) == (2, 0, 1_235_567)
    assert alpha["wall_s"] == 15.0  # a1's start to a2's end: a3 is not in it
    tickers = _json(capsys, "report", "tickers", "--db", db, "--model", "m2")
    assert [(t["run"], t["ticker"], t["calls"]) for t in tickers] == [("beta", "T1", 1), ("beta", "T3", 1)]
    daily = _json(capsys, "report", "daily", "--db", db, "--tz", "UTC", "--status", "ok")
    assert [(d["day"], d["calls"], d["failed_calls"]) for d in daily] == [("2026-03-02", 3, 0), ("2026-03-03", 3, 0)]
    eras = _json(capsys, "report", "eras", "--by", "model", "--db", db, "--since", "2026-03-03", "--tz", "UTC")
    assert [(e["group"], e["runs"]) for e in eras] == [("m1", 2)]


def test_a_filter_that_leaves_a_run_empty_is_not_a_missing_run(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _json(capsys, "report", "runs", "--db", db, "--run", "alpha", "--model", "m2") == []
    capsys.readouterr()
    assert main(["report", "runs", "--db", db, "--run", "nope", "--model", "m2"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_export_filters_and_in_flight_over_all_calls(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["export", "--db", db, "--model", "m1", "--tz", "UTC", "--since", "2026-03-02T12:00:05"]) == 0
    exported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [c["call_id"] for c in exported] == ["a2", "a3", "u1", "u2", "u3"]
    assert exported[0]["in_flight"] == 2  # a1 (left out by the filter) was still running
    assert main(["export", "--db", db, "--status", "error", "--run", "beta"]) == 0
    assert [json.loads(line)["call_id"] for line in capsys.readouterr().out.splitlines()] == ["b2"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--since", "last week"), "expected an ISO date"),
        (("--status", "bogus"), "use one or more of ok, error, failed, incomplete"),
    ],
)
def test_bad_filters_exit_2(db: str, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], message: str) -> None:
    for command in (["report", "runs"], ["report", "daily"], ["export"]):
        capsys.readouterr()
        assert main([*command, "--db", db, *flags]) == 2
        assert message in capsys.readouterr().err
