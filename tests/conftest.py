"""Shared fixtures: a fresh, migrated ledger database on each backend; the real emulator and gateway processes.

`backend_url` / `database` are parametrised over SQLite and PostgreSQL. PostgreSQL comes from
`TEST_PG_URL` (a server where the user may CREATE DATABASE); each test gets its own database,
dropped afterwards. Without `TEST_PG_URL` the PostgreSQL cases skip — unless
`LEDGER_TEST_REQUIRE_PG=1` (set by CI), where they fail instead.

`emulator` (one per module) and `gateway` (one per test, over `backend_url`) are the real `ledger emulate`
and `ledger serve` on loopback ports (tests/gateway/processes.py); a module sets `EMULATOR_SPEED` and
`GATEWAY_ENV` to change how they run. `relayed_gateway` is one on a fresh PostgreSQL ledger reached through a
relay the test can cut (tests/gateway/relay.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy.engine import make_url

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.gateway.relay import RelayedGateway, relayed_gateway
from tests.ledger.helpers import migrated
from usage_ledger.ledger.db import Database

BACKENDS = ("sqlite", "postgresql")


def _pg_admin_url() -> str | None:
    url = os.environ.get("TEST_PG_URL")
    if url:
        return url
    if os.environ.get("LEDGER_TEST_REQUIRE_PG") == "1":
        pytest.fail("TEST_PG_URL is not set but LEDGER_TEST_REQUIRE_PG=1: PostgreSQL tests must run")
    pytest.skip("PostgreSQL tests need TEST_PG_URL (e.g. postgresql://postgres@127.0.0.1:5432/test)")
    return None  # pragma: no cover


async def _pg_connect(admin_url: str) -> Any:
    import asyncpg

    parsed = make_url(admin_url)
    try:
        return await asyncpg.connect(
            host=parsed.host or "127.0.0.1",
            port=parsed.port or 5432,
            user=parsed.username or "postgres",
            password=parsed.password,
            database=parsed.database or "postgres",
        )
    except OSError as exc:  # the server is down: fail loudly, never skip
        pytest.fail(f"PostgreSQL at {admin_url} is unreachable: {exc}")


async def _pg_admin(sql: str, admin_url: str) -> None:
    conn = await _pg_connect(admin_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# Fixtures whose test migrates its database first: it gets a copy of a migrated template instead, the same schema
# without running the migrations again (≈ 1 s of a PostgreSQL test's set-up; ≈ 450 tests).
_MIGRATED_BY = frozenset({"database", "gateway"})
_templates: dict[str, str] = {}


def _migrated_template(admin_url: str) -> str:
    """A PostgreSQL database migrated to head, named after the text of the migrations and the schema modules they
    import: a change there makes a new one (older ones are dropped). Made once, by whichever xdist worker comes
    first."""
    if admin_url not in _templates:
        package = Path(__file__).resolve().parent.parent / "usage_ledger"
        sources = [
            *sorted(package.glob("migrations/**/*.py")),
            package / "ledger/schema.py",
            package / "projections/tables.py",
        ]
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
        _templates[admin_url] = f"ledger_template_{digest}"
        asyncio.run(_make_template(admin_url, _templates[admin_url]))
    return _templates[admin_url]


async def _make_template(admin_url: str, name: str) -> None:
    conn = await _pg_connect(admin_url)
    try:
        await conn.execute("SELECT pg_advisory_lock(hashtext('usage-ledger test template'))")  # until closed
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return
        stale = "SELECT datname FROM pg_database WHERE datname LIKE 'ledger\\_template\\_%'"
        for (old,) in await conn.fetch(stale):  # another tree's, or a killed run's half-made one
            await conn.execute(f'DROP DATABASE "{old}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}_building"')
        async with migrated(make_url(admin_url).set(database=f"{name}_building").render_as_string(False)):
            pass
        await conn.execute(f'ALTER DATABASE "{name}_building" RENAME TO "{name}"')
    finally:
        await conn.close()


@pytest.fixture
def fresh_pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A new PostgreSQL database for this test (dropped afterwards): empty, or migrated when the test's
    `database` or `gateway` fixture would migrate it anyway."""
    admin_url = _pg_admin_url()
    assert admin_url is not None
    name = f"ledger_t_{uuid.uuid4().hex[:12]}"
    template = f' TEMPLATE "{_migrated_template(admin_url)}"' if _MIGRATED_BY & set(request.fixturenames) else ""
    asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"{template}', admin_url))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', admin_url))


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty (not yet migrated) database URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("fresh_pg_url")
    return url


@pytest.fixture
async def database(backend_url: str) -> AsyncIterator[Database]:
    """A migrated ledger database on each backend."""
    async with migrated(backend_url) as db:
        yield db


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """A CLI run in-process (`main`) configures structlog for the process, bound to the captured stderr: each
    test starts from its defaults."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def emulator(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """`ledger emulate` for the module, at its `EMULATOR_SPEED` (default 20)."""
    speed = getattr(request.module, "EMULATOR_SPEED", 20)
    proc = processes.emulator(tmp_path_factory.mktemp("emu"), speed=speed).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def gateway(request: pytest.FixtureRequest, emulator: Process, backend_url: str, tmp_path: Path) -> Iterator[Process]:
    """`ledger serve` in front of `emulator` on a migrated ledger of each backend, the module's `GATEWAY_ENV` added
    to its environment."""
    processes.upgrade(backend_url)
    env = getattr(request.module, "GATEWAY_ENV", None)
    proc = processes.gateway(tmp_path, emulator.url, backend_url, env=env).start()  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(name="relayed_gateway")
async def _relayed_gateway(emulator: Process, fresh_pg_url: str, tmp_path: Path) -> AsyncIterator[RelayedGateway]:
    async with relayed_gateway(emulator.url, fresh_pg_url, tmp_path) as relayed:  # type: ignore[attr-defined]
        yield relayed
