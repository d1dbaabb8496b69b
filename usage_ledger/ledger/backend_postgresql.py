"""The PostgreSQL backend: asyncpg, appends on their own thread and connection (`pg_append`), read-model rows
as binary arrays per column, `FOR UPDATE` where SQLite's write lock serializes."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from sqlalchemy import BigInteger, ColumnElement, Delete, Table, cast, func, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from usage_ledger.ledger.backend import Appender, Checkpoint
from usage_ledger.ledger.events import utc_now
from usage_ledger.ledger.pg_append import PostgresAppender
from usage_ledger.ledger.schema import checkpoints, seconds_between

__all__ = ("POSTGRESQL",)

_ARRAYS_FROM = 500
"""Rows from which PostgreSQL gets them as arrays: asyncpg looks up array types once per connection
(60-80 ms here), which a follower's few rows on a fresh connection would pay every page."""
_DIGEST_PAGE = 20_000
_digest_encoder = msgspec.json.Encoder(order="sorted")
_FIRST_S = int(datetime.min.replace(tzinfo=UTC).timestamp())
_LAST_S = int(datetime.max.replace(tzinfo=UTC).timestamp())


class _Upsert:
    """A table's whole-row upserts: `INSERT … SELECT * FROM unnest($1::integer[], …) ON CONFLICT DO UPDATE`, a
    binary array per column, one statement for a page of any size; a few rows as asyncpg's pipelined
    `executemany` of the same upsert row by row. (COPY into a temp table and an upsert from it took two more
    round trips and its truncation at commit: 46-85 against 33-37 ms a small write.)"""

    def __init__(self, table: Table) -> None:
        key = [c.name for c in table.primary_key.columns]
        columns = ", ".join(c.name for c in table.columns)
        on_conflict = f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET " + ", ".join(
            f"{c.name} = excluded.{c.name}" for c in table.columns if c.name not in key
        )
        pg = postgresql.dialect()  # type: ignore[no-untyped-call]
        arrays = ", ".join(f"${i}::{c.type.compile(dialect=pg)}[]" for i, c in enumerate(table.columns, start=1))
        self.arrays = f"INSERT INTO {table.name} ({columns}) SELECT * FROM unnest({arrays}) {on_conflict}"
        params = ", ".join(f"${i}" for i in range(1, len(table.columns) + 1))
        self.row = f"INSERT INTO {table.name} ({columns}) VALUES ({params}) {on_conflict}"


class _Postgresql:
    name = "postgresql"

    def __init__(self) -> None:
        self._upserts: dict[str, _Upsert] = {}

    def ledger_file(self, url: URL) -> str | None:
        return None

    def connect(self, url: str, engine_kwargs: dict[str, Any], options: dict[str, Any]) -> tuple[AsyncEngine, Appender]:
        driver_url = make_url(url).set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
        engine = create_async_engine(driver_url, **engine_kwargs)
        # the appender's own connection, from the same URL as the engine's (host, port, user, ssl…)
        _, connect_kwargs = engine.dialect.create_connect_args(engine.url)
        appender = PostgresAppender(
            connect_kwargs,
            make_url(url).render_as_string(hide_password=True),
            lock_timeout_s=options["pg_lock_timeout_s"],
            idle_in_transaction_timeout_s=options["pg_idle_in_transaction_timeout_s"],
        )
        return engine, appender

    def insert(self, table: Table) -> Any:
        return postgresql.insert(table)

    def can_hold(self, text: str) -> bool:
        return "\x00" not in text  # a text column refuses U+0000

    async def snapshot(self, conn: AsyncConnection) -> AsyncConnection:
        return await conn.execution_options(isolation_level="REPEATABLE READ")

    async def fetch(self, conn: AsyncConnection, query: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        records = await driver.fetch(query.format(*(f"${i}" for i in range(1, len(params) + 1))), *params)
        return [tuple(r) for r in records]

    async def write_rows(
        self,
        engine: AsyncEngine,
        appender: Appender,
        table: Table,
        rows: Sequence[msgspec.Struct],
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        upsert = self._upserts.get(table.name) or self._upserts.setdefault(table.name, _Upsert(table))
        async with engine.begin() as conn:
            if checkpoint is not None:
                query = select(checkpoints.c.position).where(
                    checkpoints.c.projection == checkpoint.projection, checkpoints.c.version == checkpoint.version
                )
                found = (await conn.execute(query.with_for_update())).scalar_one_or_none()
                if (int(found) if found is not None else 0) != checkpoint.expected:
                    return False
            if rows:
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver is not None
                values = list(map(msgspec.structs.astuple, rows))
                if len(values) < _ARRAYS_FROM:
                    await driver.executemany(upsert.row, values)
                else:
                    await driver.execute(upsert.arrays, *zip(*values, strict=True))
            if checkpoint is not None:
                statement = postgresql.insert(checkpoints).values(
                    projection=checkpoint.projection,
                    version=checkpoint.version,
                    position=checkpoint.last,
                    updated_at=utc_now(),
                )
                await conn.execute(
                    statement.on_conflict_do_update(
                        index_elements=["projection", "version"],
                        set_={"position": statement.excluded.position, "updated_at": statement.excluded.updated_at},
                    )
                )
        return True

    async def delete(self, conn: AsyncConnection, statement: Delete) -> None:
        await conn.execute(statement)

    async def analyze(self, conn: AsyncConnection, table: Table) -> None:
        # without statistics (autovacuum off, or not yet round) it planned each of a digest's pages by key as a
        # scan and sort of the rest of the version
        await conn.exec_driver_sql(f"ANALYZE {table.name}")

    async def digest(self, conn: AsyncConnection, table: Table, version: int, checkpoint: str) -> str:
        # through asyncpg: the values as `UTCDateTime` returns them (timestamps in UTC)
        columns = [c.name for c in table.columns if c.name != "version"]
        (key,) = [c.name for c in table.primary_key.columns if c.name != "version"]
        query = (
            f"SELECT {', '.join(columns)} FROM {table.name} WHERE version = $1 AND {key} > $2 ORDER BY {key} LIMIT $3"
        )
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        digest = hashlib.sha256()
        after = ""
        while True:
            rows = await driver.fetch(query, version, after, _DIGEST_PAGE)
            digest.update(_digest_encoder.encode_lines([tuple(r) for r in rows]))
            if len(rows) < _DIGEST_PAGE:
                return digest.hexdigest()
            after = rows[-1][columns.index(key)]

    async def reclaim_blob_space(self, engine: AsyncEngine) -> None:
        # makes the blob table's space reusable; returning it to the operating system takes `VACUUM FULL`, which
        # locks the table (docs/operations.md)
        async with engine.connect() as conn:
            auto = await conn.execution_options(isolation_level="AUTOCOMMIT")  # VACUUM runs outside a transaction
            await auto.exec_driver_sql("VACUUM ledger_blobs")

    def byte_order(self, column: ColumnElement[str]) -> ColumnElement[str]:
        return column.collate("C")  # the database's default collation may sort otherwise

    def epoch_bucket(self, column: ColumnElement[datetime], seconds: int) -> ColumnElement[Any]:
        # asyncpg stores the calendar's first instant (0001-01-01T00:00Z, `datetime.min`) as -infinity, whose
        # epoch no integer holds: clamped to the instant it stands for (and +infinity to the last)
        epoch = func.greatest(func.least(func.extract("epoch", column), _LAST_S), _FIRST_S)
        return cast(func.floor(epoch / seconds), BigInteger)


POSTGRESQL = _Postgresql()


@compiles(seconds_between, "postgresql")
def _postgresql_seconds_between(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (compiler.process(arg, **kw) for arg in element.clauses)
    return f"CAST(EXTRACT(EPOCH FROM ({later}) - ({earlier})) AS DOUBLE PRECISION)"
