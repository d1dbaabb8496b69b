"""Admin API bounds: out-of-range paging is a 400 naming the parameter, NUL in a parameter a 404, never a 500;
the OpenAPI schema declares the bounds, 401 (token set) and 404, and leaves out its own routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import make_settings, rigged
from usage_ledger.answers.api import MAX_LIMIT, MAX_OFFSET, build_api_routers
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.read import head_position
from usage_ledger.projections.engine import catch_up_all

AUTH = {"authorization": "Bearer s3cret"}


@pytest.fixture
async def admin(database: Database, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """The gateway with the read API mounted, one recorded call; yields the client and the call id."""
    settings = make_settings(admin_token="s3cret")
    api_routers = build_api_routers(database, admin_token=settings.admin_token)
    async with rigged(database, settings, tmp_path / "spool", api_routers=api_routers) as rig:
        client = rig.client
        call = await client.post("/v1/chat/completions", content=b'{"model":"m","messages":[],"max_tokens":2}')
        await catch_up_all(database)
        yield client, call.headers["x-ledger-call-id"]


async def _head(database: Database) -> int:
    async with database.engine.connect() as conn:
        return await head_position(conn)


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"offset": "9223372036854775808"}, "offset"),  # one past int64: was a 500
        ({"offset": str(MAX_OFFSET + 1)}, "offset"),
        ({"offset": "-1"}, "offset"),
        ({"limit": "0"}, "limit"),
        ({"limit": "-5"}, "limit"),
        ({"limit": str(MAX_LIMIT + 1)}, "limit"),
        ({"limit": "99999999999999999999999"}, "limit"),
        ({"offset": "ten"}, "offset"),
    ],
)
async def test_paging_out_of_range_is_a_400_naming_the_parameter(
    admin: tuple[httpx.AsyncClient, str], database: Database, params: dict[str, str], name: str
) -> None:
    client, _ = admin
    before = await _head(database)
    response = await client.get("/_ledger/api/calls", params=params, headers=AUTH)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["status_code"] == 400 and [e["key"] for e in body["extra"]] == [name]
    assert await _head(database) == before  # nothing recorded, nothing changed


async def test_paging_at_the_bounds_answers(admin: tuple[httpx.AsyncClient, str]) -> None:
    client, call_id = admin
    last = await client.get("/_ledger/api/calls", params={"offset": MAX_OFFSET, "limit": MAX_LIMIT}, headers=AUTH)
    assert last.status_code == 200 and last.json()["items"] == [] and last.json()["limit"] == MAX_LIMIT
    first = (await client.get("/_ledger/api/calls", params={"offset": 0, "limit": 1}, headers=AUTH)).json()
    assert [c["call_id"] for c in first["items"]] == [call_id]


async def test_nul_and_unknown_values_are_400_or_404_never_500(admin: tuple[httpx.AsyncClient, str]) -> None:
    client, call_id = admin
    for path in ("/_ledger/api/calls/a%00b", "/_ledger/api/calls/a%00b/events", f"/_ledger/api/calls/{call_id}%00"):
        response = await client.get(path, headers=AUTH)
        assert response.status_code == 404 and "no call" in response.json()["detail"], (path, response.text)
    for path in ("/_ledger/api/runs", "/_ledger/api/tickers", "/_ledger/api/daily", "/_ledger/api/calls"):
        response = await client.get(path, params={"run": "r\x00"}, headers=AUTH)
        assert response.status_code == 404 and "no run" in response.json()["detail"], (path, response.text)
    for params in ({"tz": "Nowhere/X\x00"}, {"tz": ""}):
        response = await client.get("/_ledger/api/daily", params=params, headers=AUTH)
        assert response.status_code == 400 and "time zone" in response.json()["detail"]
    response = await client.get("/_ledger/api/runs", params={"formula": "x\x00"}, headers=AUTH)
    assert response.status_code == 400 and "unknown formula" in response.json()["detail"]


async def test_schema_declares_bounds_401_and_404(admin: tuple[httpx.AsyncClient, str]) -> None:
    client, _ = admin
    schema = (await client.get("/_ledger/api/schema/openapi.json", headers=AUTH)).json()
    paths = schema["paths"]
    assert not [p for p in paths if p.startswith("/_ledger/api/schema")]
    for path, operations in paths.items():
        responses = operations["get"]["responses"]
        assert {"200", "401", "404"} <= set(responses), (path, sorted(responses))
    parameters = {p["name"]: p["schema"] for p in paths["/_ledger/api/calls"]["get"]["parameters"]}
    assert (parameters["offset"]["minimum"], parameters["offset"]["maximum"]) == (0, MAX_OFFSET)
    assert (parameters["limit"]["minimum"], parameters["limit"]["maximum"]) == (1, MAX_LIMIT)
    assert "400" in paths["/_ledger/api/calls"]["get"]["responses"]
