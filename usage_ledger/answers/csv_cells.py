"""A value as a CSV cell, in every CSV the ledger writes: a text cell a spreadsheet would run as a formula
(OWASP's CSV injection) gets a leading `'`; numbers are written as they are."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ("csv_cell",)

_RUNS_AS_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """`value` for `csv.writer`: None as empty, datetimes in ISO 8601, text a spreadsheet would run behind a `'`."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str) and value.startswith(_RUNS_AS_FORMULA):
        return "'" + value
    return value
