"""The calls read model as a ClickHouse table: the DDL `ledger export --clickhouse-schema` prints (docs/scaling.md).

Its columns are the export's (`export_columns`), less `in_flight`, which changes with no new position on the
row; the sorting key holds only what a call never changes (its start and id, not `run`, which a retag moves)."""

from __future__ import annotations

from usage_ledger.answers.export_columns import EXPORT_COLUMNS, ExportColumn
from usage_ledger.projections import ProjectionError

__all__ = ("DEFAULT_TABLE", "LOW_CARDINALITY", "NOT_IN_SINK", "SINK_COLUMNS", "VERSION_COLUMN", "clickhouse_schema")

DEFAULT_TABLE = "ledger_calls"
VERSION_COLUMN = "last_position"
NOT_IN_SINK = frozenset({"in_flight"})
"""Export columns the table leaves out (see the module's docstring)."""
LOW_CARDINALITY = frozenset({"ticker", "model", "origin", "status", "usage_source", "failure_reason", "finish_reason"})
"""Text columns with few distinct values: ClickHouse stores them as a dictionary."""

SINK_COLUMNS: tuple[ExportColumn, ...] = tuple(c for c in EXPORT_COLUMNS if c.name not in NOT_IN_SINK)

# The read model's integers are signed BIGINT (or narrower): Int64 holds every value it can; the version
# column must be unsigned for ReplacingMergeTree, and positions start at 1.
_TYPES = {
    "text": "String",
    "integer": "Int64",
    "real": "Float64",
    "time": "DateTime64(6, 'UTC')",
    "tags": "Map(String, String)",
}


def _type(column: ExportColumn) -> str:
    if column.name == VERSION_COLUMN:
        return "UInt64"
    name = _TYPES[column.kind]
    if column.nullable:
        name = f"Nullable({name})"
    return f"LowCardinality({name})" if column.name in LOW_CARDINALITY else name


def _identifier(text: str) -> str:
    return "`" + text.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _table_name(table: str) -> str:
    parts = table.split(".")
    if len(parts) > 2 or not all(parts):
        raise ProjectionError(f"--table {table!r}: give a table name or database.table")
    return ".".join(_identifier(p) for p in parts)


def clickhouse_schema(table: str = DEFAULT_TABLE) -> str:
    """`CREATE TABLE` for the calls read model in ClickHouse (idempotent: `IF NOT EXISTS`)."""
    width = max(len(_identifier(c.name)) for c in SINK_COLUMNS)
    columns = [f"    {_identifier(c.name):<{width}} {_type(c)}," for c in SINK_COLUMNS]
    return "\n".join(
        [
            "-- The calls read model of usage-ledger (`ledger export --clickhouse-schema`): a copy for analytics,",
            "-- replaced per call by `last_position` on re-export; the ledger and its hash chain stay the record.",
            f"CREATE TABLE IF NOT EXISTS {_table_name(table)}",
            "(",
            *columns,
            "    INDEX run_bloom run TYPE bloom_filter GRANULARITY 4",
            ")",
            f"ENGINE = ReplacingMergeTree({VERSION_COLUMN})",
            "PARTITION BY toYYYYMM(started_at)",
            "ORDER BY (started_at, call_id);",
            "",
        ]
    )
