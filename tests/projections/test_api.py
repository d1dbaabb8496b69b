"""The read API: thin handlers over the report functions."""

from __future__ import annotations

from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.projections.helpers import append, finished, started
from usage_ledger.answers.api import build_api_routers
from usage_ledger.ledger.db import Database
from usage_ledger.projections.engine import catch_up_all


async def test_read_api(database: Database) -> None:
    await append(database, started("a", 0, run="r", ticker="AAPL"), finished("a", 0, 10, completion=101))
    await catch_up_all(database)
    app = Litestar(route_handlers=build_api_routers(database))
    async with AsyncTestClient(app) as client:
        runs = (await client.get("/runs")).json()
        assert runs[0]["run"] == "r" and runs[0]["calls"] == 1 and runs[0]["incomplete_calls"] == 0
        assert (await client.get("/runs", params={"formula": "per_call_mean"})).json()[0]["formula"] == "per_call_mean"
        assert (await client.get("/tickers")).json()[0]["ticker"] == "AAPL"
        assert (await client.get("/daily", params={"tz": "Asia/Seoul"})).json()[0]["day"] == "2026-03-02"
        page = (await client.get("/calls", params={"limit": 10})).json()
        assert [c["call_id"] for c in page["items"]] == ["a"] and page["next_offset"] is None
        assert (await client.get("/calls/a")).json()["output_tokens"] == 101
        assert (await client.get("/calls/nope")).status_code == 404
        assert (await client.get("/runs", params={"formula": "nope"})).status_code == 400
        assert (await client.get("/daily", params={"tz": "Nowhere/X"})).status_code == 400
