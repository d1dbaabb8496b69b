"""Printing report rows: a rich table, a JSON array (msgspec) or CSV (nested fields flattened)."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
from rich.console import Console
from rich.table import Table

__all__ = ("flatten", "print_rows")

_encoder = msgspec.json.Encoder()


# A run's server block in tables and CSV: the few that matter (JSON has all of it).
_SERVER_SUMMARY = (
    "spec_decode_acceptance_rate",
    "kv_cache_usage_max",
    "requests_running_mean",
    "requests_running_max",
    "reconciled",
)


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
        elif name in ("calls_per_ticker",) and value is None:
            out.update({f"{name}.min": None, f"{name}.median": None, f"{name}.max": None})
        else:
            out[name] = value
    return out


_SHORT = {
    "failed_calls": "failed",
    "incomplete_calls": "incomplete",
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
    "server.requests_running_max": "max",
    "server.reconciled": "reconciled",
}


def _cell(value: Any, zone: ZoneInfo | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        local = value.astimezone(zone) if zone else value
        return local.strftime("%Y-%m-%d %H:%M:%S %Z")
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def print_rows(rows: Sequence[msgspec.Struct], fmt: str, *, title: str = "", zone: ZoneInfo | None = None) -> None:
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
            writer.writerow(
                ["" if v is None else v.isoformat() if isinstance(v, datetime) else v for v in row.values()]
            )
        return
    console = Console() if sys.stdout.isatty() else Console(width=400)
    if not flat:
        console.print(f"[dim]{title}: no rows[/dim]" if title else "[dim]no rows[/dim]")
        return
    table = Table(title=title or None)
    for name in flat[0]:
        table.add_column(_SHORT.get(name, name), overflow="fold")
    for row in flat:
        table.add_row(*(_cell(v, zone) for v in row.values()))
    console.print(table)
