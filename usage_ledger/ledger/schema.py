"""The ledger's tables, on one `MetaData` with a constraint naming convention.

Alembic owns the schema (`migrations/`); the application never calls `create_all`. A test checks
that these definitions and the migrations do not drift.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    Uuid,
)
from sqlalchemy.sql.functions import FunctionElement

__all__ = (
    "UTCDateTime",
    "blobs",
    "checkpoints",
    "events",
    "head",
    "metadata",
    "seconds_between",
    "sqlite_bind",
    "sqlite_time",
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends (SQLite stores no offset, so re-attach UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the ledger; pass a timezone-aware datetime")
        return value.astimezone(UTC)  # SQLite's DATETIME stores the wall-clock fields and no offset

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def sqlite_time(moment: datetime) -> str:
    """An aware datetime as a `UTCDateTime` column stores it on SQLite: naive UTC, microsecond text."""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


class seconds_between(FunctionElement[float]):  # lower case, as SQLAlchemy names its SQL functions
    """`seconds_between(later, earlier)`: the seconds from one `UTCDateTime` column to another, the float
    Python's `(later - earlier).total_seconds()` gives (exact microseconds, one rounding), in SQL; each backend
    module compiles it for its database."""

    type = Float()
    inherit_cache = True


def sqlite_bind(value: Any) -> Any:
    """A value as its column stores it on SQLite (datetimes by `sqlite_time`), for plain `sqlite3`
    statements that skip SQLAlchemy's per-row parameter processing; other values as they are."""
    if isinstance(value, datetime):
        return sqlite_time(value) if value.tzinfo is not None else value.isoformat(" ", "microseconds")
    return value


events = Table(
    "ledger_events",
    metadata,
    Column("position", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=False),
    Column("event_id", Uuid(), nullable=False, unique=True),
    Column("type", String(64), nullable=False),
    Column("stream", String(255), nullable=False),
    Column("occurred_at", UTCDateTime(), nullable=False),
    Column("recorded_at", UTCDateTime(), nullable=False),
    Column("payload", Text(), nullable=False),
    Column("hash", String(64), nullable=False),
    Index(None, "stream"),
    Index(None, "type"),
)

blobs = Table(
    "ledger_blobs",
    metadata,
    Column("hash", String(64), primary_key=True),
    Column("size", BigInteger(), nullable=False),
    Column("codec", String(16), nullable=False),
    Column("stored_size", BigInteger(), nullable=False),
    Column("content", LargeBinary(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("redacted_at", UTCDateTime(), nullable=True),
)

head = Table(
    "ledger_head",
    metadata,
    # One row: the chain's last position and hash (0 and 64 zeros when empty). Appenders lock it and
    # read the tail in one statement (PostgreSQL: `SELECT … FOR UPDATE`) and move it in the transaction
    # that appends, so it is always the tail of `ledger_events`.
    Column("id", Integer(), primary_key=True, autoincrement=False),
    Column("position", BigInteger(), nullable=False),
    Column("hash", String(64), nullable=False),
    CheckConstraint("id = 1", name="one_row"),
)

checkpoints = Table(
    "ledger_checkpoints",
    metadata,
    Column("projection", String(100), primary_key=True),
    Column("version", Integer(), primary_key=True),
    Column("position", BigInteger(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)
