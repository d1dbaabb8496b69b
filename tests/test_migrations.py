"""Alembic owns the schema: upgrade → downgrade → upgrade works on both backends, and the
migrations produce exactly the tables the code declares (no drift)."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData, inspect
from sqlalchemy.engine import Connection

from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.migrate import current_revision, downgrade_database, head_revision, upgrade_database


def _declared_metadata() -> list[MetaData]:
    """Every package's MetaData the migrations must match."""
    found = [importlib.import_module("usage_ledger.ledger.schema").metadata]
    with contextlib.suppress(ModuleNotFoundError):
        found.append(importlib.import_module("usage_ledger.projections.tables").metadata)
    return found


def _drift(connection: Connection) -> list[Any]:
    combined = MetaData()
    for metadata in _declared_metadata():
        for table in metadata.tables.values():
            table.to_metadata(combined)
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, combined))


async def test_upgrade_downgrade_upgrade_without_drift(backend_url: str) -> None:
    database = open_database(backend_url, null_pool=True)
    try:
        await upgrade_database(database)
        assert await current_revision(database) == head_revision()
        await downgrade_database(database)
        assert await current_revision(database) is None
        async with database.engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert not {t for t in tables if t.startswith("ledger_")}
        await upgrade_database(database)
        async with database.engine.connect() as conn:
            assert await conn.run_sync(_drift) == []
    finally:
        await database.dispose()
