"""The export's columns, read once from `CallView`: each field's name, kind and whether it may be null.

Every typed export format is written from this one list (Parquet's Arrow schema in `export`, the
ClickHouse table in `clickhouse_sink`), so a field added to `CallView` becomes a column of each, or,
if its type is one no format knows yet, an error here at import rather than a column typed by guess.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import inspect

from usage_ledger.projections import CallView

__all__ = ("EXPORT_COLUMNS", "ColumnKind", "ExportColumn")

ColumnKind = Literal["text", "integer", "real", "time", "tags"]


class ExportColumn(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    kind: ColumnKind
    nullable: bool


def _kind(name: str, t: inspect.Type) -> ColumnKind:
    if isinstance(t, inspect.StrType):
        return "text"
    if isinstance(t, inspect.IntType):
        return "integer"
    if isinstance(t, inspect.FloatType):
        return "real"
    if isinstance(t, inspect.DateTimeType):
        return "time"
    if (
        isinstance(t, inspect.DictType)
        and isinstance(t.key_type, inspect.StrType)
        and isinstance(t.value_type, inspect.StrType)
    ):
        return "tags"
    raise TypeError(f"CallView.{name}: no export column kind for {t!r} (add one in export_columns)")


def _column(field: inspect.Field) -> ExportColumn:
    t = field.type
    nullable = False
    if isinstance(t, inspect.UnionType):
        kept = [x for x in t.types if not isinstance(x, inspect.NoneType)]
        nullable = len(kept) < len(t.types)
        if len(kept) != 1:
            raise TypeError(f"CallView.{field.name}: a union of {kept!r} has no single export column kind")
        t = kept[0]
    return ExportColumn(name=field.name, kind=_kind(field.name, t), nullable=nullable)


def _columns() -> tuple[ExportColumn, ...]:
    info = inspect.type_info(CallView)
    assert isinstance(info, inspect.StructType)
    return tuple(_column(f) for f in info.fields)


EXPORT_COLUMNS: tuple[ExportColumn, ...] = _columns()
"""`CallView`'s fields in their order (the export's column order), each with its kind."""
