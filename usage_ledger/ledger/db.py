"""Opening the ledger database from a plain URL, with the project's async drivers and hooks.

`sqlite:///path.db` → aiosqlite (`backend_sqlite`); `postgresql://user@host/db` → asyncpg
(`backend_postgresql`). Any other scheme is a `ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import NullPool

from usage_ledger.ledger.backend import Appender, Backend
from usage_ledger.ledger.backend_postgresql import POSTGRESQL
from usage_ledger.ledger.backend_sqlite import SQLITE, WRITER_OPTION
from usage_ledger.ledger.errors import ConfigError

__all__ = ("Database", "backend_of", "ledger_file", "open_database")

_BACKENDS: dict[str, Backend] = {"sqlite": SQLITE, "postgresql": POSTGRESQL, "postgres": POSTGRESQL}
"""Every backend, by the names of its URL schemes and of its SQLAlchemy dialect."""


@dataclass(frozen=True, slots=True)
class Database:
    """An engine, its backend's ways, and its serialized appender."""

    engine: AsyncEngine
    url: str
    backend_ops: Backend
    appender: Appender

    @property
    def backend(self) -> str:
        """The backend's name, for messages and logs."""
        return self.backend_ops.name

    @property
    def safe_url(self) -> str:
        """The URL with any password masked: the only form that goes into messages and logs."""
        return make_url(self.url).render_as_string(hide_password=True)

    async def writer(self) -> AsyncConnection:
        """A connection whose transactions take the append lock up front (SQLite BEGIN IMMEDIATE)."""
        conn = await self.engine.connect()
        return await conn.execution_options(**{WRITER_OPTION: True})

    async def dispose(self) -> None:
        self.appender.close()
        await self.engine.dispose()


def backend_of(conn: AsyncConnection) -> Backend:
    """The backend a connection is on."""
    return _BACKENDS[conn.dialect.name]


def _parsed(url: str) -> tuple[URL, Backend]:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(
            f"cannot parse database URL {url!r}: use sqlite:///path.db or postgresql://user@host/db"
        ) from exc
    backend = _BACKENDS.get(parsed.get_backend_name())
    if backend is None:
        raise ConfigError(
            f"unsupported database URL scheme {parsed.drivername!r} in {parsed.render_as_string(hide_password=True)}: "
            "use sqlite:///path.db or postgresql://user@host/db"
        )
    return parsed, backend


def ledger_file(url: str) -> str | None:
    """The file a URL's ledger lives in; None for a ledger on a server (or in memory, or a URL that is not one)."""
    try:
        parsed, backend = _parsed(url)
    except ConfigError:
        return None  # reported where the URL is opened
    return backend.ledger_file(parsed)


def open_database(
    url: str,
    *,
    null_pool: bool = False,
    sqlite_synchronous: str = "full",
    pg_lock_timeout_s: float = 2.0,
    pg_idle_in_transaction_timeout_s: float = 5.0,
    **engine_kwargs: Any,
) -> Database:
    """Create the engine (no I/O yet); connection errors surface on first use.

    `sqlite_synchronous`: `full` (a commit is on disk when it returns) or `normal` (WAL commits
    survive a process crash but the last ones may be lost on power failure; no fsync per commit).
    `pg_*`: PostgreSQL appends' bounds on a stopped holder of the head (`PostgresAppender`).
    """
    if sqlite_synchronous not in ("full", "normal"):
        raise ConfigError(f"sqlite_synchronous must be full or normal, not {sqlite_synchronous!r}")
    _, backend = _parsed(url)
    kwargs: dict[str, Any] = dict(engine_kwargs)
    if null_pool:
        kwargs["poolclass"] = NullPool
    options = {
        "sqlite_synchronous": sqlite_synchronous,
        "pg_lock_timeout_s": pg_lock_timeout_s,
        "pg_idle_in_transaction_timeout_s": pg_idle_in_transaction_timeout_s,
    }
    engine, appender = backend.connect(url, kwargs, options)
    return Database(engine=engine, url=url, backend_ops=backend, appender=appender)
