"""Reading the shared CLI options: call filters, table columns, pages of calls."""

from __future__ import annotations

import argparse
from typing import Any
from zoneinfo import ZoneInfo

from usage_ledger.answers import CallFilter, parse_filter
from usage_ledger.commands.output import parse_columns
from usage_ledger.ledger import ConfigError
from usage_ledger.projections import CallsPage

__all__ = ("filters_from_args", "page_line", "page_offset", "table_options")


def filters_from_args(args: argparse.Namespace, zone: ZoneInfo) -> CallFilter:
    """--since / --until / --model / --status (dates and naive times in `zone`)."""
    return parse_filter(zone=zone, since=args.since, until=args.until, model=args.model, status=args.status)


def table_options(args: argparse.Namespace) -> dict[str, Any]:
    """print_rows keywords from --columns / --wide."""
    return {"columns": parse_columns(getattr(args, "columns", None)), "wide": getattr(args, "wide", False)}


def page_offset(args: argparse.Namespace) -> int:
    """The offset of the page asked for by --offset or --page (of --limit calls)."""
    limit: int = args.limit
    page: int | None = args.page
    offset: int = args.offset
    if limit < 1 or limit > 1000:
        raise ConfigError(f"--limit {limit}: use 1..1000 calls a page")
    if page is not None:
        if page < 1:
            raise ConfigError(f"--page {page}: pages count from 1")
        return (page - 1) * limit
    if offset < 0:
        raise ConfigError(f"--offset {offset}: must not be negative")
    return offset


def page_line(page: CallsPage, limit: int) -> str:
    """`calls 21-40 of 1,700; next: --page 3` (what is shown, the total, how to go on)."""
    total = page.total if page.total is not None else page.offset + len(page.items)
    if not page.items:
        return f"no calls at offset {page.offset:,} (the run has {total:,})"
    shown = f"calls {page.offset + 1:,}-{page.offset + len(page.items):,} of {total:,}"
    if page.next_offset is None:
        return shown
    if page.offset % limit == 0:
        return f"{shown}; next: --page {page.next_offset // limit + 1}"
    return f"{shown}; next: --offset {page.next_offset}"
