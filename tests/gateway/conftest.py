"""Gateway fixtures: the gateway on a loopback port (`tests.gateway.live`) over a real ledger (both backends)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.live import live_gateway, serving
from tests.gateway.upstream import FakeUpstream
from usage_ledger.gateway.app import GatewayApp
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import Event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter


@dataclass
class Rig:
    app: GatewayApp
    client: httpx.AsyncClient
    upstream: FakeUpstream  # or the ASGI app given to `rigged`
    writer: EventWriter
    database: Database

    async def events(self) -> list[Event]:
        return [stored.body() async for stored in iter_events(self.database)]


def make_settings(**overrides: object) -> GatewaySettings:
    """GatewaySettings for a test gateway; `live_gateway` sets `upstream` to the real upstream's address."""
    return GatewaySettings(upstream="http://upstream.invalid", **overrides)  # type: ignore[arg-type]


@pytest.fixture
def settings() -> GatewaySettings:
    return make_settings()


@contextlib.asynccontextmanager
async def rigged(
    database: Database,
    settings: GatewaySettings,
    spool_dir: Path,
    *,
    upstream: FakeUpstream | None = None,
    **create: Any,
) -> AsyncIterator[Rig]:
    """The gateway on a loopback port in front of `upstream` (an ASGI app; a `FakeUpstream` by default), recording into
    `database`, and a client for it; `create` goes to `create_app` (api_routers, …)."""
    upstream = upstream if upstream is not None else FakeUpstream()
    async with (
        serving(upstream) as upstream_url,
        EventWriter(database, Spool(spool_dir)) as writer,
        live_gateway(settings, database=database, writer=writer, upstream=upstream_url, **create) as gateway,
        httpx.AsyncClient(base_url=gateway.url, trust_env=False) as client,
    ):
        yield Rig(app=gateway.app, client=client, upstream=upstream, writer=writer, database=database)


@pytest.fixture
async def rig(database: Database, settings: GatewaySettings, tmp_path: Path) -> AsyncIterator[Rig]:
    async with rigged(database, settings, tmp_path / "spool") as rig:
        yield rig
