"""`/_ledger/api/decide`: the object `ledger decide --format json` prints, behind the admin token."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tests.gateway.conftest import make_settings, rigged
from tests.projections.decide_trace import (
    DENSE,
    MOE,
    SCALE,
    append_trace,
    build_labels,
    build_returns,
    write_labels,
    write_returns,
)
from usage_ledger.answers.api import build_api_routers
from usage_ledger.answers.decide import decide
from usage_ledger.imports.label_import import import_labels, import_returns
from usage_ledger.ledger.db import Database
from usage_ledger.projections.engine import catch_up_all


async def test_decide_api(database: Database, tmp_path: Path) -> None:
    labels = build_labels()
    await append_trace(database, labels)
    await import_labels(database, write_labels(tmp_path / "l.csv", labels))
    await import_returns(database, write_returns(tmp_path / "r.csv", build_returns()))
    await catch_up_all(database)
    expected = msgspec.json.decode(msgspec.json.encode(await decide(database, MOE, DENSE, ",".join(SCALE))))
    settings = make_settings(admin_token="s3cret")
    query = {"a": ",".join(MOE), "b": ",".join(DENSE), "scale": ",".join(SCALE)}
    api_routers = build_api_routers(database, admin_token="s3cret")
    async with rigged(database, settings, tmp_path / "spool", api_routers=api_routers) as rig:
        client = rig.client
        auth = {"authorization": "Bearer s3cret"}
        assert (await client.get("/_ledger/api/decide", params=query)).status_code == 401
        answer = await client.get("/_ledger/api/decide", params=query, headers=auth)
        assert answer.status_code == 200 and answer.json() == expected
        evidence = answer.json()["a"]["evidence"]  # the intervals (held to SciPy in test_decide_evidence.py)
        assert evidence["self_qwk"]["n"] == 99 and len(evidence["self_qwk"]["ci95"]) == 2
        assert answer.json()["between"]["evidence"]["qwk"]["ci95"] is not None
        bad = {**query, "a": "ghost"}
        assert (await client.get("/_ledger/api/decide", params=bad, headers=auth)).status_code == 404
        narrow = {**query, "scale": "Sell,Hold,Buy"}
        refused = await client.get("/_ledger/api/decide", params=narrow, headers=auth)
        assert refused.status_code == 400 and "labels outside --scale" in refused.json()["detail"]
        dated = await client.get("/_ledger/api/decide", params={**query, "as_of": "2026-02-30"}, headers=auth)
        assert dated.status_code == 400 and dated.json()["extra"][0]["key"] == "as_of"
        schema = (await client.get("/_ledger/api/schema/openapi.json", headers=auth)).json()
        assert "/_ledger/api/decide" in schema["paths"]
