"""Opening the ledger database from a plain URL, with the project's async drivers and hooks.

`sqlite:///path.db` → aiosqlite, WAL, `BEGIN IMMEDIATE` for writers (serialized appends);
`postgresql://user@host/db` → asyncpg, appends on their own thread and connection
(`pg_append.PostgresAppender`). Any other scheme is a `ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.pg_append import PostgresAppender
from usage_ledger.ledger.sqlite_append import SqliteAppender

__all__ = ("Database", "async_url", "open_database")

Backend = Literal["sqlite", "postgresql"]

# execution option a writer sets on its connection: SQLite then begins with BEGIN IMMEDIATE
WRITER_OPTION = "ledger_writer"


@dataclass(frozen=True, slots=True)
class Database:
    """An engine plus what the ledger needs to know about its backend."""

    engine: AsyncEngine
    backend: Backend
    url: str
    sqlite_appender: SqliteAppender | None = None
    postgres_appender: PostgresAppender | None = None

    @property
    def safe_url(self) -> str:
        """The URL with any password masked: the only form that goes into messages and logs."""
        return make_url(self.url).render_as_string(hide_password=True)

    async def writer(self) -> AsyncConnection:
        """A connection whose transactions take the append lock up front (SQLite BEGIN IMMEDIATE)."""
        conn = await self.engine.connect()
        return await conn.execution_options(**{WRITER_OPTION: True})

    async def dispose(self) -> None:
        if self.sqlite_appender is not None:
            self.sqlite_appender.close()
        if self.postgres_appender is not None:
            self.postgres_appender.close()
        await self.engine.dispose()


def async_url(url: str) -> tuple[str, Backend]:
    """Translate a plain database URL into the async-driver URL the project uses."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(
            f"cannot parse database URL {url!r}: use sqlite:///path.db or postgresql://user@host/db"
        ) from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False), "sqlite"
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False), "postgresql"
    raise ConfigError(
        f"unsupported database URL scheme {parsed.drivername!r} in {parsed.render_as_string(hide_password=True)}: "
        "use sqlite:///path.db or postgresql://user@host/db"
    )


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
    driver_url, backend = async_url(url)
    kwargs: dict[str, Any] = dict(engine_kwargs)
    if null_pool:
        kwargs["poolclass"] = NullPool
    if backend == "sqlite":
        kwargs.setdefault("connect_args", {}).setdefault("timeout", 30)
    engine = create_async_engine(driver_url, **kwargs)
    if backend == "sqlite":
        _install_sqlite_hooks(engine, sqlite_synchronous.upper())
        appender = SqliteAppender(make_url(driver_url).database or ":memory:", sqlite_synchronous.upper())
        return Database(engine=engine, backend=backend, url=url, sqlite_appender=appender)
    # the appender's own connection, from the same URL as the engine's (host, port, user, ssl…)
    _, connect_kwargs = engine.dialect.create_connect_args(engine.url)
    safe_url = make_url(url).render_as_string(hide_password=True)
    pg_appender = PostgresAppender(
        connect_kwargs,
        safe_url,
        lock_timeout_s=pg_lock_timeout_s,
        idle_in_transaction_timeout_s=pg_idle_in_transaction_timeout_s,
    )
    return Database(engine=engine, backend=backend, url=url, postgres_appender=pg_appender)


def _install_sqlite_hooks(engine: AsyncEngine, synchronous: str) -> None:
    # SQLAlchemy's documented recipe: let the driver leave transactions to us, then emit BEGIN
    # ourselves, IMMEDIATE for writers so appends are serialized from their first statement.
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(WRITER_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
