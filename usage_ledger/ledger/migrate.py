"""Schema upgrades through Alembic, on a live connection of ours (works inside a running loop).

Looking at a SQLite ledger that does not exist (reading its revision, `require_head`, a downgrade)
never creates the file: opening a SQLite URL would leave an empty database behind, and the next
`ledger serve` would then find "revision none" in a file the user never made. Only an upgrade
creates it.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from usage_ledger.ledger.db import Database, ledger_file
from usage_ledger.ledger.errors import ConfigError, DatabaseUnavailable, SchemaError

__all__ = (
    "Revision",
    "alembic_config",
    "current_revision",
    "database_exists",
    "downgrade_database",
    "downgrade_steps",
    "head_revision",
    "require_head",
    "revision_history",
    "upgrade_database",
)


class Revision(msgspec.Struct, frozen=True, kw_only=True):
    revision: str
    down_revision: str | None
    doc: str
    is_head: bool


_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def revision_history() -> list[Revision]:
    """Every revision, newest first (the chain is linear)."""
    scripts = ScriptDirectory.from_config(alembic_config())
    return [
        Revision(
            revision=script.revision,
            down_revision=script.down_revision if isinstance(script.down_revision, str) else None,
            doc=script.doc or "",
            is_head=script.is_head,
        )
        for script in scripts.walk_revisions()
    ]


def downgrade_steps(current: str | None, target: str) -> list[Revision]:
    """The revisions a downgrade from `current` to `target` (a revision or `base`) undoes, newest first."""
    history = revision_history()
    names = [r.revision for r in history]
    if target != "base" and target not in names:
        raise ConfigError(f"unknown revision {target!r}: use one of {', '.join(names)} or base (`ledger db history`)")
    if current is None:
        return []
    if current not in names:
        raise SchemaError(f"the database is at revision {current!r}, which this release does not know")
    start = names.index(current)
    stop = len(names) if target == "base" else names.index(target)
    if stop < start:
        raise ConfigError(f"revision {target!r} is newer than the database's {current!r}: use `ledger db upgrade`")
    return history[start:stop]


def database_exists(database: Database) -> bool:
    """False for a SQLite file that is not there (PostgreSQL: True, the server says the rest)."""
    path = ledger_file(database.url)
    if path is None or path.startswith("file:"):
        return True
    return Path(path).exists()


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
    if not database_exists(database):
        raise SchemaError(f"no ledger database at {database.safe_url}: nothing to downgrade")
    await _run(database, "downgrade", target)


async def current_revision(database: Database) -> str | None:
    """The schema revision, or None when not migrated (a missing SQLite file is left missing)."""
    if not database_exists(database):
        return None

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
    if not database_exists(database):
        raise SchemaError(f"no ledger database at {database.safe_url}: create it with `ledger db upgrade`")
    current = await current_revision(database)
    head = head_revision()
    if current != head:
        raise SchemaError(
            f"the ledger schema in {database.safe_url} is at revision {current or 'none'}, expected {head}: "
            "run `ledger db upgrade`"
        )
