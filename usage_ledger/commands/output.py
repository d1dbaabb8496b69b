"""Printing report rows: a rich table, a JSON array (msgspec) or CSV (nested fields flattened).

Tables fit the terminal (DESIGN §6: a 100-column terminal must not cut cells to 3 characters):
a row type has a compact default column set (`_COMPACT`); `columns=` picks any flattened fields,
`wide=True` shows them all at their natural width (for `less -S`). The default view is fitted by
`usage_ledger.narrow` (`_PRIORITY`, `_KEEP`), and a note names the columns left out.
JSON and CSV are machine formats: every field, raw values, whatever the terminal.
"""

from __future__ import annotations

import csv
import functools
import os
import shutil
import sys
import typing
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from usage_ledger.answers import csv_cell, in_zone
from usage_ledger.narrow import Column, clip, fit_table
from usage_ledger.projections import ProjectionError

__all__ = (
    "DEFAULT_WIDTH",
    "UnknownColumns",
    "flatten",
    "parse_columns",
    "print_rows",
    "terminal_width",
)

_encoder = msgspec.json.Encoder()

DEFAULT_WIDTH = 100
"""Width of a table written off a terminal without COLUMNS (a file, a pipe, a test's capture)."""
_MIN_TEXT = 12
"""A record's value column is never narrower."""

# A run's server block in tables and CSV: the few that matter (JSON has all of it).
_SERVER_SUMMARY = (
    "spec_decode_acceptance_rate",
    "kv_cache_usage_max",
    "requests_running_mean",
    "requests_running_max",
    "reconciled",
)

# Default table columns per row type (by class name: no import of the row modules), the few a user reads;
# `--wide` or `--columns` show the rest. Types not listed show every column, fitted.
_COMPACT: dict[str, tuple[str, ...]] = {
    "RunRow": (
        "run",
        "calls",
        "truncated_calls",
        "input_tokens",
        "output_tokens",
        "wall_s",
        "throughput_tps",
        "server.spec_decode_acceptance_rate",
        "server.reconciled",
    ),
    "EraRow": (
        "group",
        "runs",
        "measured_runs",
        "days",
        "mean_throughput_tps",
        "median_throughput_tps",
        "min_throughput_tps",
        "max_throughput_tps",
        "mean_wall_s",
    ),
    "CallView": (
        "call_id",
        "ticker",
        "status",
        "input_tokens",
        "output_tokens",
        "elapsed_s",
        "ttft_s",
        "decode_tps",
    ),
}
# columns of the compact set shown only where some row has a value (the server block: where sampled)
_OPTIONAL: dict[str, frozenset[str]] = {
    "RunRow": frozenset({"truncated_calls", "server.spec_decode_acceptance_rate", "server.reconciled"}),
}

# What a narrow terminal keeps longest (higher first); a column not named here goes first, from the right, and
# a negative one before the first column (a run's name) is shortened (usage_ledger.narrow).
_PRIORITY: dict[str, dict[str, float]] = {
    "RunRow": {
        "wall_s": 90,
        "output_tokens": 80,
        "calls": 70,
        "input_tokens": 60,
        "server.spec_decode_acceptance_rate": 50,
        "server.reconciled": -1,  # negative: left out before run names are shortened
        "truncated_calls": -2,
    },
    "EraRow": {
        "runs": 90,
        "mean_wall_s": 80,
        "median_throughput_tps": 70,
        "min_throughput_tps": 60,
        "max_throughput_tps": 60,
        "days": 50,
    },
    "TickerRow": {"output_tokens": 90, "calls": 80, "input_tokens": 70},
    "DailyRow": {"output_tokens": 90, "calls": 80, "input_tokens": 70, "failed_calls": 60},
    "WeekdayRow": {"output_tokens": 90, "calls": 80, "input_tokens": 70, "failed_calls": 60},
    "CallView": {"status": 90, "output_tokens": 80, "elapsed_s": 70, "ttft_s": 60},
}
# The figure a table exists for: never left out, whatever the width (the row's name, the first column, neither).
_KEEP: dict[str, frozenset[str]] = {
    "RunRow": frozenset({"throughput_tps"}),
    "EraRow": frozenset({"mean_throughput_tps"}),
    "TickerRow": frozenset({"ticker"}),
}
# First columns that stay whole (an id to copy), never shortened in the middle.
_WHOLE_KEYS = frozenset({"call_id"})

# Means of counts (`report daily --weekday-mean`) are whole numbers in tables; JSON and CSV keep the exact mean.
_WHOLE: dict[str, frozenset[str]] = {
    "WeekdayRow": frozenset({"calls", "failed_calls", "input_tokens", "output_tokens"}),
}


class UnknownColumns(ProjectionError):
    """`--columns` named a field the rows do not have (exit 2, listing the valid names)."""


def flatten(row: msgspec.Struct) -> dict[str, Any]:
    """One level of nesting flattened as `parent.child`; dicts of labels as `labels.name`."""
    out: dict[str, Any] = {}
    for name in row.__struct_fields__:
        value = getattr(row, name)
        if name == "server":
            out.update({f"server.{f}": getattr(value, f) if value is not None else None for f in _SERVER_SUMMARY})
        elif isinstance(value, msgspec.Struct):
            for child in value.__struct_fields__:
                out[f"{name}.{child}"] = getattr(value, child)
        elif isinstance(value, dict):
            out[name] = ",".join(f"{k}={v}" for k, v in sorted(value.items()))
        elif value is None and (nested := _struct_field(type(row), name)) is not None:
            out.update({f"{name}.{child}": None for child in nested.__struct_fields__})  # columns as when present
        else:
            out[name] = value
    return out


@functools.cache
def _struct_field(row_type: type[msgspec.Struct], name: str) -> type[msgspec.Struct] | None:
    """The Struct a field holds when it is not None (`calls_per_ticker`, `cost`), else None."""
    hint = typing.get_type_hints(row_type).get(name)
    for arg in typing.get_args(hint) or (hint,):
        if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
            return arg
    return None


def parse_columns(text: str | None) -> list[str] | None:
    """`--columns a,b,c` as a list (None when not given)."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UnknownColumns("--columns needs at least one field name, e.g. --columns run,calls")
    return names


_SHORT = {
    "failed_calls": "failed",
    "incomplete_calls": "incomplete",
    "truncated_calls": "truncated",
    "input_tokens": "input",
    "output_tokens": "output",
    "throughput_tps": "tok/s",
    "calls_per_ticker.min": "per ticker min",
    "calls_per_ticker.median": "median",
    "calls_per_ticker.max": "max",
    "hours_per_100_tickers": "h/100 tickers",
    "server.spec_decode_acceptance_rate": "accept",
    "server.kv_cache_usage_max": "KV max",
    "server.requests_running_mean": "running mean",
    "server.requests_running_max": "running max",
    "server.reconciled": "reconciled",
    "mean_throughput_tps": "mean tok/s",
    "median_throughput_tps": "median",
    "min_throughput_tps": "min",
    "max_throughput_tps": "max",
    "mean_wall_s": "mean wall_s",
    "measured_runs": "in means",
}


def _cell(value: Any, zone: ZoneInfo | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        local = in_zone(value, zone) if zone else value
        return f"{local.replace(tzinfo=None).isoformat(' ', 'seconds')} {local.strftime('%Z')}"  # 0001, not 1
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _numeric(values: Sequence[Any]) -> bool:
    """Right-aligned: every value a number (a column of only `-` too)."""
    present = [v for v in values if v is not None]
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)


def terminal_width() -> int:
    """COLUMNS, else the terminal's width, else (a pipe, a file) DEFAULT_WIDTH."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return DEFAULT_WIDTH


def _console(width: int) -> Console:
    # a height too: with the width alone, rich sizes a TERM=dumb terminal (Emacs, some CI) at 80 columns
    return Console(width=width, height=shutil.get_terminal_size((width, 24)).lines, soft_wrap=False)


def _chosen(
    row_type: type[msgspec.Struct], flat: list[dict[str, Any]], columns: Sequence[str] | None, wide: bool
) -> list[str]:
    """The columns to show: those asked for (checked), all (`wide`), or the type's compact set."""
    available = list(flat[0])
    if columns is not None:
        unknown = [c for c in columns if c not in available]
        if unknown:
            raise UnknownColumns(
                f"--columns: unknown {', '.join(repr(c) for c in unknown)}; valid: {', '.join(available)}"
            )
        return list(columns)
    compact = _COMPACT.get(row_type.__name__)
    if wide or compact is None:
        return available
    optional = _OPTIONAL.get(row_type.__name__, frozenset())
    return [c for c in compact if c not in optional or any(r.get(c) is not None for r in flat)]


def _print_title(console: Console, title: str) -> None:
    # its own line, not the table's title (rich wraps that to the table's width); Text: a `[` is not markup
    if title:
        console.print(Text(clip(title, console.width), style="bold"))


def print_rows(
    rows: Sequence[msgspec.Struct],
    fmt: str,
    *,
    title: str = "",
    zone: ZoneInfo | None = None,
    columns: Sequence[str] | None = None,
    wide: bool = False,
    record: bool = False,
    width: int | None = None,
) -> None:
    """Print `rows` as `fmt` (table, json, csv). Tables: see the module docstring; `record` = one field a line."""
    if fmt == "json":
        sys.stdout.buffer.write(_encoder.encode(list(rows)) + b"\n")
        sys.stdout.flush()
        return
    flat = [flatten(r) for r in rows]
    if fmt == "csv":
        if not flat:
            return
        writer = csv.writer(sys.stdout)
        writer.writerow(list(flat[0]))
        for row in flat:
            writer.writerow([csv_cell(v) for v in row.values()])
        return
    width = width or terminal_width()
    if not flat:
        _console(width).print(f"{title}: no rows" if title else "no rows", style="dim", markup=False)
        return
    names = _chosen(type(rows[0]), flat, columns, wide or record)
    if record:
        _print_record(flat[0], names, title, zone, width)
        return
    whole = _WHOLE.get(type(rows[0]).__name__, frozenset())
    cells = {n: [_cell(round(r[n]) if n in whole and r[n] is not None else r[n], zone) for r in flat] for n in names}
    numeric = {n: _numeric([r[n] for r in flat]) for n in names}
    kind = type(rows[0]).__name__
    priority, keep = _PRIORITY.get(kind, {}), _KEEP.get(kind, frozenset())
    specs = [
        Column(
            _SHORT.get(n, n),
            numeric=numeric[n],
            priority=priority.get(n, -i - 1.0),
            keep=n in keep,
            whole=n in _WHOLE_KEYS,
        )
        for i, n in enumerate(names)
    ]
    table = [[cells[n][i] for n in names] for i in range(len(flat))]
    asked = wide or columns is not None  # asked for: natural width, even past the terminal (nothing hidden)
    fitted = fit_table(specs, table, sys.maxsize if asked else width)
    console = _console(max(width, fitted.width) if asked else width)
    _print_title(console, title)
    console.print(fitted.table)
    hidden = [names[i] for i in range(len(names)) if i not in fitted.shown]
    if hidden:
        more = f"{len(hidden)} more column{'s' if len(hidden) > 1 else ''}"
        note = f"{more} (--wide, --columns): {', '.join(hidden)}"
        console.print(clip(note, width), style="dim", markup=False)


def _print_record(row: dict[str, Any], names: Sequence[str], title: str, zone: ZoneInfo | None, width: int) -> None:
    """One row as `field  value` lines: a single call or run fits any terminal."""
    label = max(len(n) for n in names)
    room = max(_MIN_TEXT, width - label - 5)  # two columns' padding and separator
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, show_header=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", no_wrap=True, overflow="ellipsis", max_width=room)
    for name in names:
        table.add_row(name, Text(clip(_cell(row[name], zone), room)))
    console = _console(width)
    _print_title(console, title)
    console.print(table)
