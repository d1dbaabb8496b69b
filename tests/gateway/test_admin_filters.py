"""The admin API's lists take the CLI's call filters (since, until, model, status; times local in `tz`),
`/calls` says the total on every page, bad values are a 400 naming what was wrong, and the OpenAPI
schema documents all of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import make_settings
from tests.projections.fit_seed import AUTO_1, AUTO_2, seed_fit_ledger
from usage_ledger.answers.api import build_api_routers
from usage_ledger.answers.filters import STATUS_PATTERN
from usage_ledger.gateway.admin import create_admin_app
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter
from usage_ledger.projections.settings import ReportSettings

AUTH = {"authorization": "Bearer s3cret"}
API = "/_ledger/api"


@pytest.fixture
async def client(database: Database, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The admin app (what the gateway mounts under /_ledger/) with the read API over the `fit_seed`
    ledger, LEDGER_TZ=UTC."""
    await seed_fit_ledger(database)
    settings = make_settings(admin_token="s3cret")
    async with EventWriter(database, Spool(tmp_path / "spool")) as writer:
        app = create_admin_app(
            settings,
            database=database,
            writer=writer,
            metrics=Metrics(),
            api_routers=build_api_routers(database, ReportSettings(tz="UTC"), admin_token=settings.admin_token),
        )
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # Litestar's ASGI types are narrower
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as http:
            yield http


async def _get(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    response = await client.get(API + path, params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


async def test_calls_filtered_and_paged_with_the_total(client: httpx.AsyncClient) -> None:
    page = await _get(client, "/calls", limit=2)
    assert page["total"] == 8 and [c["call_id"] for c in page["items"]] == ["a1", "a2"] and page["next_offset"] == 2
    page = await _get(client, "/calls", model="m1", limit=2, offset=2)
    assert page["total"] == 6 and [c["call_id"] for c in page["items"]] == ["a3", "u1"]
    page = await _get(client, "/calls", status="error,failed")
    assert page["total"] == 2 and [c["call_id"] for c in page["items"]] == ["a3", "b2"]
    page = await _get(client, "/calls", since="2026-03-03", run=AUTO_1)
    assert page["total"] == 2 and page["next_offset"] is None
    page = await _get(client, "/calls", until="2026-03-02T21:30", tz="Asia/Seoul")  # 12:30 UTC
    assert page["total"] == 3 and {c["call_id"] for c in page["items"]} == {"a1", "a2", "a3"}


async def test_reports_filtered(client: httpx.AsyncClient) -> None:
    runs = await _get(client, "/runs", model="m1")
    assert [(r["run"], r["calls"]) for r in runs] == [("alpha", 3), (AUTO_1, 2), (AUTO_2, 1)]
    runs = await _get(client, "/runs", since="2026-03-03T12:01")  # LEDGER_TZ=UTC
    assert [(r["run"], r["calls"]) for r in runs] == [(AUTO_1, 1), (AUTO_2, 1)]
    tickers = await _get(client, "/tickers", status="failed")
    assert [(t["run"], t["ticker"], t["calls"]) for t in tickers] == [("alpha", "T1", 1)]
    daily = await _get(client, "/daily", model="m2")
    assert [(d["day"], d["calls"]) for d in daily] == [("2026-03-02", 2)]
    means = await _get(client, "/daily/weekday-mean", until="2026-03-02")
    assert [(m["weekday"], m["calls"]) for m in means] == [("Mon", 5.0), ("Mon-Fri", 5.0)]


@pytest.mark.parametrize(
    "params",
    [
        {"since": "soon"},
        {"until": "2026-03-02\x00"},
        {"until": "2026-03-02T25:00"},
        {"since": "2026-02-30"},
        {"until": "2026-04-31T09:00"},
        {"since": "2026-13-01"},
    ],
)
async def test_bad_filters_are_400_naming_the_parameter(client: httpx.AsyncClient, params: dict[str, str]) -> None:
    """`filters.parse_time`, the CLI's parser, refuses them: an impossible day is not a date."""
    for path in ("/calls", "/runs", "/tickers", "/daily", "/daily/weekday-mean"):
        response = await client.get(API + path, params=params, headers=AUTH)
        assert response.status_code == 400, (path, response.text)
        assert [e["key"] for e in response.json()["extra"]] == list(params), (path, response.text)
        assert repr(next(iter(params.values()))) in response.json()["detail"], response.text


@pytest.mark.parametrize(
    ("since", "until", "calls"),
    [("2026-11-29", "2026-12-31", 0), ("2026-01-30", "2026-01-31T23:59:59", 0), ("2024-02-29", "2026-03-31 09:00", 8)],
)
async def test_every_real_day_is_a_bound(client: httpx.AsyncClient, since: str, until: str, calls: int) -> None:
    """Days 29-31 are days (they were refused by a schema narrowed to please a fuzzer); the seed's calls
    are of 2-3 March 2026."""
    for path in ("/runs", "/tickers", "/daily", "/daily/weekday-mean"):
        await _get(client, path, since=since, until=until)
    assert (await _get(client, "/calls", since=since, until=until))["total"] == calls


async def test_moments_at_the_calendars_edge_are_no_bound(client: httpx.AsyncClient) -> None:
    """A real date-time whose UTC instant falls outside the calendar bounds nothing on that side."""
    assert (await _get(client, "/calls", since="0001-01-01T00:00+01:00"))["total"] == 8
    assert (await _get(client, "/calls", until="9999-12-31"))["total"] == 8
    assert (await _get(client, "/calls", since="9999-12-31T23:59:59-05:00"))["total"] == 0


async def test_an_empty_range_matches_nothing(client: httpx.AsyncClient) -> None:
    for path in ("/runs", "/tickers", "/daily"):
        assert await _get(client, path, since="2026-03-03", until="2026-03-02") == []
    assert (await _get(client, "/calls", since="2026-03-03", until="2026-03-02"))["total"] == 0


async def test_unknown_status_is_400_naming_the_parameter(client: httpx.AsyncClient) -> None:
    for value in ("done", "ok,", "ok\x00"):
        response = await client.get(API + "/calls", params={"status": value}, headers=AUTH)
        assert response.status_code == 400, response.text
        assert [e["key"] for e in response.json()["extra"]] == ["status"]


async def test_model_with_nul_matches_as_stored(client: httpx.AsyncClient) -> None:
    page = await _get(client, "/calls", model="m\x001")
    assert page["total"] == 0 and page["items"] == []


async def test_schema_documents_the_filters_and_the_total(client: httpx.AsyncClient) -> None:
    schema = (await client.get(API + "/schema/openapi.json", headers=AUTH)).json()
    for path in ("/runs", "/tickers", "/daily", "/daily/weekday-mean", "/calls"):
        parameters = {p["name"]: p for p in schema["paths"][API + path]["get"]["parameters"]}
        assert {"since", "until", "model", "status", "tz"} <= set(parameters), path
        assert "ISO date" in parameters["since"]["description"]
        assert parameters["status"]["schema"]["pattern"] == STATUS_PATTERN
        for bound in ("since", "until"):
            formats = [option.get("format") for option in parameters[bound]["schema"]["oneOf"]]
            assert formats == ["date", "date-time", None], (path, parameters[bound])
    page = schema["components"]["schemas"]["CallsPage"]
    assert "total" in page["properties"]
