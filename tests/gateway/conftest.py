"""Gateway fixtures: the app factory wired to a real ledger (both backends) and an injected upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.gateway.upstream import FakeUpstream
from usage_ledger.gateway.app import GatewayApp, create_app
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import Event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.settings import Settings
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter


@dataclass
class Rig:
    app: GatewayApp
    client: httpx.AsyncClient
    upstream: FakeUpstream
    writer: EventWriter
    database: Database

    async def events(self) -> list[Event]:
        return [stored.body() async for stored in iter_events(self.database)]


def make_settings(**overrides: object) -> Settings:
    return Settings(upstream="http://upstream.test", **overrides)  # type: ignore[arg-type]


@pytest.fixture
def settings() -> Settings:
    return make_settings()


@pytest.fixture
async def rig(database: Database, settings: Settings, tmp_path: Path) -> AsyncIterator[Rig]:
    upstream = FakeUpstream()
    upstream_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream), base_url=settings.upstream)
    async with EventWriter(database, Spool(tmp_path / "spool")) as writer:
        app = create_app(settings, database=database, writer=writer, http_client=upstream_client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as client:
            yield Rig(app=app, client=client, upstream=upstream, writer=writer, database=database)
    await upstream_client.aclose()
