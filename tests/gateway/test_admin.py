from __future__ import annotations

from pathlib import Path

from litestar import Router, get

from tests.gateway.conftest import make_settings, rigged
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.guesses import FREE_GUESSES


@get("/ping")
async def ping() -> dict[str, str]:
    return {"pong": "yes"}


async def test_admin_routes_guard_and_call_api(database: Database, tmp_path: Path) -> None:
    settings = make_settings(admin_token="s3cret")
    extra = [Router(path="/extra", route_handlers=[ping])]
    async with rigged(database, settings, tmp_path / "spool", api_routers=extra) as rig:
        client = rig.client
        call = await client.post("/v1/chat/completions", content=b'{"model":"m","messages":[],"max_tokens":2}')
        call_id = call.headers["x-ledger-call-id"]
        auth = {"authorization": "Bearer s3cret"}

        health = await client.get("/_ledger/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        for path in (
            "/_ledger/metrics",
            f"/_ledger/api/calls/{call_id}/events",
            "/_ledger/api/extra/ping",
            "/_ledger/api/schema/openapi.json",
        ):
            assert (await client.get(path)).status_code == 401, path
            assert (await client.get(path, headers={"authorization": "Bearer wrong"})).status_code == 401
            assert (await client.get(path, headers=auth)).status_code == 200, path

        metrics = (await client.get("/_ledger/metrics", headers=auth)).text
        assert 'ledger_gateway_calls_total{status="200"} 1' in metrics
        assert 'ledger_gateway_call_duration_seconds_bucket{le="+Inf"} 1' in metrics
        assert "ledger_gateway_call_duration_seconds_count 1" in metrics
        detail = (await client.get(f"/_ledger/api/calls/{call_id}/events", headers=auth)).json()
        assert [e["type"] for e in detail["events"]] == ["call.started", "call.finished"]
        assert detail["events"][1]["body"]["usage"]["completion_tokens"] == 2
        assert (await client.get("/_ledger/api/calls/nope", headers=auth)).status_code == 404
        schema = (await client.get("/_ledger/api/schema/openapi.json", headers=auth)).json()
        assert "/_ledger/api/calls/{call_id}/events" in schema["paths"] and "/_ledger/api/extra/ping" in schema["paths"]
        assert (await client.get("/_ledger/api/extra/ping", headers=auth)).json() == {"pong": "yes"}


async def test_bearer_guesses_at_the_admin_api_are_slowed_down(database: Database, tmp_path: Path) -> None:
    """Before, wrong `Authorization: Bearer` tokens at `/_ledger/api/*` were answered 401 without end."""
    async with rigged(database, make_settings(admin_token="s3cret"), tmp_path / "spool") as rig:
        client = rig.client
        assert (await client.get("/_ledger/metrics")).status_code == 401  # no token offered: not a guess
        for _ in range(FREE_GUESSES + 1):  # the last shuts the door
            wrong = await client.get("/_ledger/metrics", headers={"authorization": "Bearer wrong"})
            assert wrong.status_code == 401
        for token in ("wrong", "s3cret"):  # while it is shut, the token is not compared
            refused = await client.get("/_ledger/api/schema/openapi.json", headers={"authorization": f"Bearer {token}"})
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, token
        assert (await client.get("/_ledger/health")).status_code == 200  # health needs no token
