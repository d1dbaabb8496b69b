"""Schema upgrades through Alembic, on a live connection of ours (works inside a running loop)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import DatabaseUnavailable, SchemaError

__all__ = (
    "alembic_config",
    "current_revision",
    "downgrade_database",
    "head_revision",
    "require_head",
    "upgrade_database",
)

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def _run(database: Database, action: str, target: str) -> None:
    config = alembic_config()

    def run(connection: Connection) -> None:
        config.attributes["connection"] = connection
        getattr(command, action)(config, target)

    try:
        async with database.engine.begin() as conn:
            await conn.run_sync(run)
    except (OperationalError, OSError) as exc:
        raise DatabaseUnavailable(f"cannot reach the database {database.safe_url}: {exc}") from exc


async def upgrade_database(database: Database, target: str = "head") -> None:
    await _run(database, "upgrade", target)


async def downgrade_database(database: Database, target: str = "base") -> None:
    await _run(database, "downgrade", target)


async def current_revision(database: Database) -> str | None:
    def read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    try:
        async with database.engine.connect() as conn:
            return await conn.run_sync(read)
    except (OperationalError, OSError) as exc:
        raise DatabaseUnavailable(f"cannot reach the database {database.safe_url}: {exc}") from exc
    except DBAPIError as exc:  # pragma: no cover - driver-specific
        raise DatabaseUnavailable(f"database error on {database.safe_url}: {exc}") from exc


async def require_head(database: Database) -> None:
    """Fail with a clear message unless the schema is at the newest revision."""
    current = await current_revision(database)
    head = head_revision()
    if current != head:
        raise SchemaError(
            f"the ledger schema in {database.safe_url} is at revision {current or 'none'}, expected {head}: "
            "run `ledger db upgrade`"
        )
