"""Readers never fail on a stored value (#52 point 7): calls imported at the ends of the calendar
(`0001-01-01T00:00Z`, `9999-12-31T23:59Z`) are counted in `daily` in every zone and shown in the dashboard; a
zone name no file system can hold and a dashboard offset past any 64-bit integer are 400s, not 500s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.projections.helpers import append
from usage_ledger.answers import in_zone, parse_zone
from usage_ledger.answers.api import build_api_routers
from usage_ledger.answers.reports import daily_report
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallImported, new_event
from usage_ledger.projections.engine import catch_up_all
from usage_ledger.projections.errors import ProjectionError
from usage_ledger.projections.settings import ReportSettings
from usage_ledger.ui.api import MAX_OFFSET
from usage_ledger.ui.routers import create_ui_app

FIRST = datetime(1, 1, 1, 0, 0, tzinfo=UTC)
LAST = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
ZONES = ("UTC", "Asia/Seoul", "America/New_York", "Pacific/Kiritimati", "Etc/GMT+12")


async def _seed_extremes(database: Database, *moments: tuple[str, datetime]) -> None:
    events = [
        new_event(
            CallImported(
                call_id=name,
                source="t",
                line=line,
                started_at=at,
                finished_at=at + timedelta(seconds=0.5),
                input_tokens=10,
                output_tokens=1,
                run="edges",
            ),
            stream=f"call-{name}",
        )
        for line, (name, at) in enumerate(moments or (("first", FIRST), ("last", LAST)), start=1)
    ]
    await append(database, *events)
    await catch_up_all(database)


@pytest.mark.parametrize("tz", ZONES)
async def test_daily_counts_calls_at_the_ends_of_the_calendar_in_every_zone(database: Database, tz: str) -> None:
    await _seed_extremes(database)
    rows = await daily_report(database, tz=tz)
    # west of UTC the first call's local day, east of it the last's, is outside years 1..9999: its UTC day
    assert [(r.day, r.calls) for r in rows] == [("0001-01-01", 1), ("9999-12-31", 1)]


async def test_calls_before_1970_count_on_their_own_utc_day(database: Database) -> None:
    # SQLite's integer division truncates toward zero: a negative epoch time was counted a bucket late
    moments = [(f"c{i}", datetime(1969, 12, 31, 23, 50, tzinfo=UTC) + timedelta(minutes=i * 4)) for i in range(5)]
    moments.append(("older", datetime(1900, 3, 1, 23, 59, 59, tzinfo=UTC)))
    await _seed_extremes(database, *moments)
    rows = await daily_report(database)
    assert [(r.day, r.calls) for r in rows] == [("1900-03-01", 1), ("1969-12-31", 3), ("1970-01-01", 2)]
    seoul = await daily_report(database, tz="Asia/Seoul", refresh=False)  # +09:00: all on the next local day
    assert [(r.day, r.calls) for r in seoul] == [("1900-03-02", 1), ("1970-01-01", 5)]


async def test_the_api_and_the_dashboard_answer_over_the_ends_of_the_calendar(database: Database) -> None:
    await _seed_extremes(database)
    api = Litestar(route_handlers=build_api_routers(database))
    async with AsyncTestClient(api) as client:
        for tz in ZONES:
            answer = await client.get("/daily", params={"tz": tz})
            assert answer.status_code == 200 and sum(d["calls"] for d in answer.json()) == 2, (tz, answer.text)
            assert (await client.get("/daily/weekday-mean", params={"tz": tz})).status_code == 200
    for tz in ZONES:
        app = create_ui_app(database, ReportSettings(tz=tz), admin_token=None, refresh=False)
        async with AsyncTestClient(app) as client:
            for path in ("/_ledger/ui/daily", "/_ledger/ui/api/daily", "/_ledger/ui/calls", "/_ledger/ui/"):
                answer = await client.get(path, params={"tz": tz} if "daily" in path else None)
                assert answer.status_code == 200, (tz, path, answer.text[:300])
            page = await client.get("/_ledger/ui/call", params={"id": "first"})
            assert page.status_code == 200 and "<td>0001-01-01 " in page.text  # 09:00 in Seoul


def test_a_moment_whose_local_time_leaves_the_calendar_is_shown_in_utc() -> None:
    new_york, seoul = parse_zone("America/New_York"), parse_zone("Asia/Seoul")
    assert in_zone(FIRST, new_york) == FIRST and in_zone(FIRST, new_york).tzinfo is UTC
    assert in_zone(LAST, seoul) == LAST and in_zone(LAST, new_york).tzinfo is new_york
    assert in_zone(FIRST, seoul).tzinfo is seoul  # 09:00 local on the same day: inside the calendar


async def test_a_zone_name_too_long_for_a_file_name_is_a_400(database: Database) -> None:
    with pytest.raises(ProjectionError, match="unknown time zone"):
        parse_zone("A" * 300)
    api = Litestar(route_handlers=build_api_routers(database))
    async with AsyncTestClient(api) as client:
        for path in ("/daily", "/runs", "/tickers", "/daily/weekday-mean"):
            answer = await client.get(path, params={"tz": "Europe/" + "x" * 300})
            assert answer.status_code == 400 and "unknown time zone" in answer.json()["detail"], (path, answer.text)
    app = create_ui_app(database, ReportSettings(), admin_token=None, refresh=False)
    async with AsyncTestClient(app) as client:
        for path in ("/_ledger/ui/daily", "/_ledger/ui/api/daily"):
            answer = await client.get(path, params={"tz": "x" * 300})
            assert answer.status_code == 400, (path, answer.text[:300])


@pytest.mark.parametrize("offset", [str(10**30), str(MAX_OFFSET + 1), str(2**63)])
async def test_a_dashboard_offset_past_the_bound_is_a_400(database: Database, offset: str) -> None:
    app = create_ui_app(database, ReportSettings(), admin_token=None, refresh=False)
    async with AsyncTestClient(app) as client:
        for path in ("/_ledger/ui/calls", "/_ledger/ui/api/calls"):
            answer = await client.get(path, params={"offset": offset})
            assert answer.status_code == 400 and answer.json()["extra"][0]["key"] == "offset", (path, answer.text)
        assert (await client.get("/_ledger/ui/calls", params={"offset": str(MAX_OFFSET)})).status_code == 200
        assert (await client.get("/_ledger/ui/calls", params={"offset": "-5"})).status_code == 200  # the first page
