"""The dashboard's JSON endpoints and pages over a seeded ledger, on both backends (no browser):
figures as the reports give them, the token door, bodies only behind it, and the gateway mounting it."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient

from tests.ui.seed import DENSE_CALLS, MOE_CALLS, REQUEST_BODY, RESPONSE_BODY, seed_ledger
from usage_ledger.answers.api import build_api_routers
from usage_ledger.answers.reports import runs_report
from usage_ledger.gateway import Upstream
from usage_ledger.gateway.app import create_app
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.writer import EventWriter
from usage_ledger.projections.settings import ReportSettings
from usage_ledger.ui.auth import COOKIE
from usage_ledger.ui.routers import build_ui_routers, create_ui_app

TOKEN = "t0ken"


@pytest.fixture
async def seeded(database: Database) -> Database:
    await seed_ledger(database)
    return database


async def test_the_endpoints_give_the_reports_figures(seeded: Database) -> None:
    app = create_ui_app(seeded, ReportSettings(), admin_token=None, refresh=False)
    async with AsyncTestClient(app) as client:
        runs = (await client.get("/_ledger/ui/api/runs")).json()
        reported = await runs_report(seeded, refresh=False)
        assert [r["run"] for r in runs["runs"]] == [r.run for r in reported] == ["moe-a", "dense-b"]
        assert runs["chart"]["label"] == "hardware" and runs["chart"]["groups"] == ["a100", "h100"]
        assert runs["chart"]["y"] == [[reported[0].throughput_tps, None], [None, reported[1].throughput_tps]]

        run = (await client.get("/_ledger/ui/api/run", params={"run": "moe-a"})).json()
        assert run["run"]["calls"] == MOE_CALLS and not run["live"]
        assert run["run"]["truncated_calls"] is None  # the seed's calls say no finish reason
        assert sum(run["ttft"]["counts"]) == MOE_CALLS and run["ttft"]["edges"][0] == pytest.approx(0.2)
        assert [t["calls"] for t in run["tickers"]] == [3, 3]
        assert run["server"]["kv_cache_usage"] == [0.0, 0.4, 0.1]
        assert (await client.get("/_ledger/ui/api/run", params={"run": "nope"})).status_code == 404
        page = await client.get("/_ledger/ui/run", params={"run": "moe-a"})
        assert 'data-field="truncated_calls"' in page.text

        eras = (await client.get("/_ledger/ui/api/eras")).json()
        assert sorted(eras["eras"]) == ["batch_aggregate", "per_call_mean"] and eras["groups"] == ["a100", "h100"]
        by_model = (await client.get("/_ledger/ui/api/eras", params={"by": "model"})).json()
        assert by_model["groups"] == ["qwen-moe", "gemma-dense"]

        daily = (await client.get("/_ledger/ui/api/daily", params={"tz": "Asia/Seoul"})).json()
        assert [d["day"] for d in daily["days"]] == ["2026-03-02", "2026-03-04"]
        assert (await client.get("/_ledger/ui/api/daily", params={"tz": "Nowhere/X"})).status_code == 400

        compare = (await client.get("/_ledger/ui/api/compare", params=[("run", "moe-a"), ("run", "dense-b")])).json()
        calls_row = next(m for m in compare["metrics"] if m["name"] == "calls")
        assert calls_row == {"name": "calls", "values": [MOE_CALLS, DENSE_CALLS], "ratios": [DENSE_CALLS / MOE_CALLS]}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, MOE_CALLS + DENSE_CALLS),
        ({"status": "failed"}, 1),
        ({"model": "qwen-moe", "ticker": "MSFT"}, 3),
        ({"run": "dense-b"}, DENSE_CALLS),
        ({"since": "2026-03-03"}, DENSE_CALLS),
        ({"until": "2026-03-02T12:00:02"}, 2),  # until is exclusive; a date-time without offset is LEDGER_TZ (UTC)
        ({"since": "2026-03-02T21:00+09:00", "until": "2026-03-02T21:00:10+09:00"}, 3),
        ({"since": "2026-01-30", "until": "2026-03-31"}, MOE_CALLS + DENSE_CALLS),  # days 29-31 are days
        ({"since": "2026-03-29"}, 0),
    ],
)
async def test_the_call_filters(seeded: Database, params: dict[str, str], expected: int) -> None:
    async with AsyncTestClient(create_ui_app(seeded, ReportSettings(), admin_token=None, refresh=False)) as client:
        found = (await client.get("/_ledger/ui/api/calls", params=params)).json()
        assert found["total"] == expected == len(found["items"])


async def test_bad_filters_answer_400_and_name_the_parameter(seeded: Database) -> None:
    async with AsyncTestClient(create_ui_app(seeded, ReportSettings(), admin_token=None, refresh=False)) as client:
        for since in ("yesterday", "2026-02-30"):
            answer = await client.get("/_ledger/ui/api/calls", params={"since": since})
            assert answer.status_code == 400 and f"since {since!r}" in answer.json()["detail"]
            assert [e["key"] for e in answer.json()["extra"]] == ["since"]
        page = await client.get("/_ledger/ui/calls", params={"status": "weird"})
        assert page.status_code == 400 and "status" in page.text


async def test_the_token_guards_pages_api_and_bodies(seeded: Database) -> None:
    app = create_ui_app(seeded, ReportSettings(), admin_token=TOKEN, refresh=False)
    async with AsyncTestClient(app) as client:
        assert (await client.get("/_ledger/ui/api/runs")).status_code == 401
        away = await client.get("/_ledger/ui/call?id=moe-a-0", follow_redirects=False)
        assert away.status_code == 303 and away.headers["location"].startswith("/_ledger/ui/login?next=")
        refused = await client.post("/_ledger/ui/login", data={"token": "wrong", "next": "/_ledger/ui/"})
        assert refused.status_code == 401 and COOKIE not in refused.cookies
        # a `next` off the dashboard is not followed (no open redirect)
        entered = await client.post(
            "/_ledger/ui/login", data={"token": TOKEN, "next": "https://evil.example/"}, follow_redirects=False
        )
        assert entered.status_code == 303 and entered.headers["location"] == "/_ledger/ui/"
        set_cookie = entered.headers["set-cookie"]
        assert "HttpOnly" in set_cookie and "samesite=strict" in set_cookie.lower() and TOKEN not in set_cookie
        detail = (await client.get("/_ledger/ui/api/call", params={"id": "moe-a-0"})).json()
        assert (
            detail["request"]["text"] == REQUEST_BODY.decode() and detail["response"]["text"] == RESPONSE_BODY.decode()
        )
        redacted = (await client.get("/_ledger/ui/api/call", params={"id": "moe-a-1"})).json()
        assert redacted["request"]["text"] is None and "redacted" in redacted["request"]["missing"]
        page = await client.get("/_ledger/ui/call", params={"id": "moe-a-0"})
        assert "price of AAPL &lt;b&gt;today&lt;/b&gt;" in page.text  # the body, escaped
    async with AsyncTestClient(app) as client:  # a script: the admin API's bearer header
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/_ledger/ui/api/runs", headers=bearer)).status_code == 200
        forged = {"Cookie": f"{COOKIE}={TOKEN}"}
        assert (await client.get("/_ledger/ui/api/runs", headers=forged)).status_code == 401


async def test_logout_ends_the_session_for_every_copy_of_its_cookie(seeded: Database) -> None:
    app = create_ui_app(seeded, ReportSettings(), admin_token=TOKEN, refresh=False)
    async with AsyncTestClient(app) as client:
        first = await client.post("/_ledger/ui/login", data={"token": TOKEN, "next": "/_ledger/ui/"})
        copied = {"Cookie": f"{COOKIE}={first.cookies[COOKIE] if COOKIE in first.cookies else client.cookies[COOKIE]}"}
        client.cookies.clear()
        await client.post("/_ledger/ui/login", data={"token": TOKEN, "next": "/_ledger/ui/"})
        other = client.cookies[COOKIE]
        assert other not in copied["Cookie"]  # each login is a session of its own
        assert (await client.get("/_ledger/ui/api/runs", headers=copied)).status_code == 200
        client.cookies.clear()
        out = await client.post("/_ledger/ui/logout", headers=copied, follow_redirects=False)
        assert out.status_code == 303
        assert (
            await client.get("/_ledger/ui/api/runs", headers=copied)
        ).status_code == 401  # revoked, not just cleared
        assert (await client.get("/_ledger/ui/api/runs", headers={"Cookie": f"{COOKIE}={other}"})).status_code == 200


async def test_without_a_token_the_bodies_stay_hidden(seeded: Database) -> None:
    async with AsyncTestClient(create_ui_app(seeded, ReportSettings(), admin_token=None, refresh=False)) as client:
        detail = (await client.get("/_ledger/ui/api/call", params={"id": "moe-a-0"})).json()
        assert detail["bodies_shown"] is False and detail["request"] is None and detail["response"] is None
        page = await client.get("/_ledger/ui/call", params={"id": "moe-a-0"})
        assert "price of AAPL" not in page.text and len(detail["events"]) == 2


async def test_ledger_serve_mounts_the_dashboard_beside_the_admin_api(seeded: Database, tmp_path: object) -> None:
    settings = GatewaySettings(admin_token=TOKEN)
    writer = EventWriter(seeded, None)
    upstream = Upstream(settings)
    try:
        app = create_app(
            settings,
            database=seeded,
            writer=writer,
            upstream=upstream,
            api_routers=build_api_routers(seeded, ReportSettings(), admin_token=TOKEN),
            ui_routers=build_ui_routers(seeded, ReportSettings(), admin_token=TOKEN),
        )
        async with AsyncTestClient(app.admin) as client:
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert (await client.get("/_ledger/ui/", headers=bearer)).status_code == 200
            assert (await client.get("/_ledger/ui/", follow_redirects=False)).status_code == 303
            schema = (await client.get("/_ledger/api/schema/openapi.json", headers=bearer)).json()
            assert {"/_ledger/ui/api/runs", "/_ledger/ui/api/calls", "/_ledger/ui/api/compare"} <= set(schema["paths"])
            assert not any(p.startswith("/_ledger/ui/") and "/api/" not in p for p in schema["paths"])
            assert (await client.get("/_ledger/api/runs", headers=bearer)).json()[0]["run"] == "moe-a"
    finally:
        await upstream.aclose()


async def test_the_call_list_pages_with_a_total(seeded: Database) -> None:
    async with AsyncTestClient(create_ui_app(seeded, ReportSettings(), admin_token=None, refresh=False)) as client:
        page = (await client.get("/_ledger/ui/api/calls", params={"offset": 3, "limit": 3})).json()
        assert [c["call_id"] for c in page["items"]] == ["moe-a-3", "moe-a-4", "moe-a-5"]
        assert page["total"] == MOE_CALLS + DENSE_CALLS and page["next_offset"] == 6
        last = (await client.get("/_ledger/ui/api/calls", params={"offset": 9, "limit": 3})).json()
        assert [c["call_id"] for c in last["items"]] == ["dense-b-3"] and last["next_offset"] is None
        assert (await client.get("/_ledger/ui/api/calls", params={"limit": 0})).status_code == 400
