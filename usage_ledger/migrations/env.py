"""Alembic environment (async). Runs on SQLite and PostgreSQL, batch mode for SQLite ALTERs.

`ledger db upgrade` hands a live connection in `config.attributes["connection"]`; the plain
`alembic` command builds its own engine from `LEDGER_DATABASE_URL` / `sqlalchemy.url`.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.schema import metadata
from usage_ledger.projections.tables import metadata as projections_metadata

config = context.config


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=[metadata, projections_metadata],
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("LEDGER_DATABASE_URL", "sqlite:///./ledger.db")
    database = open_database(url, null_pool=True)
    try:
        async with database.engine.connect() as conn:
            await conn.run_sync(_configure_and_run)
            await conn.commit()
    finally:
        await database.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `ledger db upgrade`")
run_migrations_online()
