"""The work behind the projections subcommands (each returns an exit code via `run_command`)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from zoneinfo import ZoneInfo

import msgspec

from usage_ledger.answers import (
    DEFAULT_TABLE,
    EraRow,
    clickhouse_schema,
    daily_report,
    eras_report,
    export_calls,
    get_call,
    parse_zone,
    recompute_report,
    runs_report,
    show_call,
    show_run,
    tickers_report,
    weekday_mean,
)
from usage_ledger.commands.bodies import body_lines
from usage_ledger.commands.output import print_rows, terminal_width
from usage_ledger.commands.progress import advance, progress, stage
from usage_ledger.commands.report_options import filters_from_args, page_line, page_offset, table_options
from usage_ledger.commands.support import async_command, checked_database, logged_settings
from usage_ledger.commands.table_notes import print_table_notes
from usage_ledger.imports import import_file
from usage_ledger.ledger import (
    CallRetagged,
    ConfigError,
    Database,
    RunAnnotated,
    append_events,
    call_stream,
    freeze_startup_heap,
    new_event,
)
from usage_ledger.projections import (
    CURRENCY_LABEL,
    PRICE_LABEL,
    PROJECTIONS,
    ImportFailed,
    NotFound,
    ProjectionError,
    catch_up_all,
    follow_projections,
    parse_price,
    projection_named,
    projection_status,
    rebuild_projection,
    set_formula,
)

__all__ = (
    "annotate_command",
    "export_command",
    "import_command",
    "projections_run_command",
    "projections_status_command",
    "rebuild_command",
    "recompute_command",
    "report_command",
    "retag_command",
    "show_call_command",
    "show_run_command",
)

_encoder = msgspec.json.Encoder()


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"{flag} {item!r}: expected NAME=VALUE")
        out[name.strip().lower()] = value
    return out


def _when(text: str, flag: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected ISO 8601 with an offset, e.g. 2026-03-01T00:00+09:00") from None
    if value.tzinfo is None:
        raise ConfigError(f"{flag} {text!r}: add a UTC offset (Z or +09:00)")
    return value


@async_command
async def import_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    failed = False
    async with checked_database(settings) as database:
        for name in args.files:
            with progress("bytes") as bar:
                task = bar.add_task(f"import {name}", total=None)
                try:
                    result = await import_file(
                        database,
                        name,
                        fmt=args.input_format,
                        source=args.source,
                        skip_invalid=args.skip_invalid,
                        progress=advance(bar, task),
                    )
                except ImportFailed as exc:
                    print(f"ledger: error: {name}: {exc}", file=sys.stderr)
                    failed = True
                    continue
            for line in result.errors[:20]:
                print(f"skipped {line}", file=sys.stderr)
            for line in result.warnings[:20]:
                print(f"ledger: warning: {line}", file=sys.stderr)
            if len(result.warnings) > 20:
                print(f"ledger: warning: … and {len(result.warnings) - 20} more", file=sys.stderr)
            print(
                f"{name}: {result.rows} rows, {result.appended} calls imported, "
                f"{result.duplicates} already present, {result.invalid} invalid skipped"
            )
    return 2 if failed else 0


@async_command
async def report_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    zone = parse_zone(settings.reports.tz)
    selected = filters_from_args(args, zone)
    table = table_options(args)
    gap = settings.reports.run_gap_s
    notes: list[str] = []
    async with checked_database(settings) as database:
        if args.kind == "runs":
            rows: list[msgspec.Struct] = list(
                await runs_report(database, formula=args.formula, run=args.run, run_gap_s=gap, filters=selected)
            )
        elif args.kind == "tickers":
            rows = list(await tickers_report(database, run=args.run, run_gap_s=gap, filters=selected))
        elif args.kind == "eras":
            if not args.by:
                raise ProjectionError("report eras needs --by LABEL (hardware, model, kind or any annotation label)")
            eras = eras_report(
                database, by=args.by, kind=args.run_kind, formula=args.formula, zone=zone, filters=selected
            )
            rows = list(await eras)
            if rows and all(isinstance(row, EraRow) and row.group is None for row in rows):
                runs = await runs_report(database, run_gap_s=gap, filters=selected)
                labels = sorted({name for run in runs for name in run.labels} | {"model"})
                notes.append(
                    f"no run carries a {args.by} label; the labels runs carry: {', '.join(labels)} "
                    "(--by model groups by the served model)"
                )
        else:
            days = await daily_report(database, tz=settings.reports.tz, run=args.run, run_gap_s=gap, filters=selected)
            rows = list(weekday_mean(days)) if args.weekday_mean else list(days)
        title = f"{args.kind} ({settings.reports.tz})" if args.kind == "daily" else args.kind
        title = f"eras by {args.by}" if args.kind == "eras" else title
        print_rows(rows, args.output_format, title=title, zone=zone, **table)
        if args.output_format == "table" and args.kind in ("runs", "eras") and rows:
            print_table_notes(args, rows, notes)
    return 0


@async_command
async def rebuild_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    names = args.names or sorted(PROJECTIONS)
    for name in names:  # every name checked before the first rebuild starts
        projection_named(name)
    async with checked_database(settings) as database:
        for name in names:
            with progress("events") as bar:
                task = bar.add_task(f"rebuild {name}", total=None)
                promoted = await rebuild_projection(
                    database,
                    name,
                    formula=args.formula if name == "calls" else None,
                    keep_old=args.keep_old,
                    workers=args.workers,
                    progress=advance(bar, task),
                    stage=stage(bar, task, f"rebuild {name}"),
                )
            print(
                f"{name}: version {promoted.version} promoted at position {promoted.head_position} "
                f"(formula {promoted.formula}, digest {promoted.digest})"
            )
    return 0


@async_command
async def projections_run_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    async with checked_database(settings) as database:
        if args.follow:
            freeze_startup_heap()
            await follow_projections(database)
        checkpoints = await catch_up_all(database)
    for name, position in sorted(checkpoints.items()):
        print(f"{name}: caught up to position {position}")
    return 0


@async_command
async def projections_status_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    async with checked_database(settings) as database:
        rows = await projection_status(database)
    print_rows(rows, args.output_format, title="projections")
    return 0


@async_command
async def recompute_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    async with checked_database(settings) as database:
        rows = await recompute_report(database, args.formula, run_gap_s=settings.reports.run_gap_s)
        promoted = await set_formula(database, args.formula) if args.promote else None
    print_rows(rows, args.output_format, title=f"recompute with {args.formula}")
    if promoted is not None:
        print(f"default formula is now {promoted.formula} (calls version {promoted.version})", file=sys.stderr)
    return 0


@async_command
async def annotate_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    labels = _pairs(args.label, "--label")
    for key in ("hardware", "model", "kind"):
        if getattr(args, key):
            labels[key] = getattr(args, key)
    labels.update(_price_labels(args.price_per_hour, args.currency))
    if not labels:
        raise ConfigError(
            "nothing to annotate: give --hardware, --model, --kind, --price-per-hour P --currency C "
            "or --label NAME=VALUE"
        )
    start = _when(args.start, "--from") if args.start else None
    end = _when(args.end, "--to") if args.end else None
    if args.end and args.run:
        raise ConfigError("--to goes with --from, not with --run")
    body = RunAnnotated(labels=labels, run=args.run, start=start, end=end)
    stream = f"run-{args.run}" if args.run else "run-range"
    async with checked_database(settings) as database:
        if args.run and not args.force:
            await _require_run(database, args.run, settings.reports.run_gap_s)
        result = await append_events(database, [new_event(body, stream=stream)])
    print(f"run.annotated appended at position {result.last_position}")
    return 0


def _price_labels(price: str | None, currency: str | None) -> dict[str, str]:
    """The price labels (`projections.cost`): both flags or neither, a positive price, a currency without spaces."""
    if price is None and currency is None:
        return {}
    if price is None or currency is None:
        raise ConfigError("--price-per-hour and --currency go together, e.g. --price-per-hour 1.89 --currency USD")
    if parse_price(price) is None:
        raise ConfigError(f"--price-per-hour {price!r}: give a number above 0, e.g. 1.89")
    if not currency.strip() or any(c.isspace() for c in currency.strip()):
        raise ConfigError(f"--currency {currency!r}: give a currency code without spaces, e.g. USD")
    return {PRICE_LABEL: str(parse_price(price)), CURRENCY_LABEL: currency.strip()}


async def _require_run(database: Database, run: str, run_gap_s: float) -> None:
    """Refuse a run no call carries (a typo would otherwise append a permanent, dangling label)."""
    try:
        await runs_report(database, run=run, run_gap_s=run_gap_s)
    except NotFound:
        raise NotFound(
            f"--run {run!r}: no call in the ledger carries that run, nothing appended; check the name with "
            "`ledger report runs` (an X-Ledger-Run value, an import's run, or an auto-… name), "
            "or pass --force to label it anyway"
        ) from None


@async_command
async def retag_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    tags = _pairs(args.tag, "--tag")
    if args.run is None and not tags and not args.remove_tag:
        raise ConfigError("nothing to change: give --run, --tag NAME=VALUE or --remove-tag NAME")
    if not args.reason.strip():
        raise ConfigError("--reason must say why the call is retagged")
    async with checked_database(settings) as database:
        await get_call(database, args.call_id)
        body = CallRetagged(
            call_id=args.call_id, reason=args.reason, run=args.run, tags=tags, removed_tags=args.remove_tag
        )
        result = await append_events(database, [new_event(body, stream=call_stream(args.call_id))])
    print(f"call.retagged appended at position {result.last_position}")
    return 0


@async_command
async def export_command(args: argparse.Namespace) -> int:
    if args.clickhouse_schema:
        sys.stdout.write(clickhouse_schema(args.table or DEFAULT_TABLE))
        return 0
    if args.table is not None:
        raise ConfigError("--table names the table of --clickhouse-schema; add that flag")
    settings = logged_settings(args, "tz", "run_gap_s")
    selected = filters_from_args(args, parse_zone(settings.reports.tz))
    async with checked_database(settings) as database:
        done = await export_calls(
            database,
            fmt=args.output_format,
            run=args.run,
            output=args.output,
            stdout=sys.stdout.buffer,
            run_gap_s=settings.reports.run_gap_s,
            filters=selected,
            since_position=args.since_position,
        )
    where = f" to {args.output}" if args.output else ""
    print(
        f"{done.calls} calls written{where}; read model at position {done.position}: "
        f"the next export of what changed is --since-position {done.position}",
        file=sys.stderr,
    )
    return 0


@async_command
async def show_call_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    table = table_options(args)
    async with checked_database(settings) as database:
        detail = await show_call(database, args.call_id, bodies=not args.no_bodies)
    if args.output_format == "json":
        sys.stdout.buffer.write(_encoder.encode(detail) + b"\n")
        return 0
    zone = ZoneInfo(settings.reports.tz)
    print_rows([detail.call], "table", title=f"call {args.call_id}", zone=zone, record=True, **table)
    for event in detail.events:
        print(f"{event.position:>10}  {event.occurred_at.astimezone(zone).isoformat()}  {event.type}")
    for label, body in (("request", detail.request), ("response", detail.response)):
        if body is not None:
            print(f"--- {label} body ({body.blob}) ---")
            lines = body_lines(body.text, width=terminal_width(), full=args.full) if body.text is not None else []
            print("\n".join(lines) if body.text is not None else f"[{body.error}]")
    return 0


@async_command
async def show_run_command(args: argparse.Namespace) -> int:
    settings = logged_settings(args, "tz", "run_gap_s")
    zone = parse_zone(settings.reports.tz)
    table = table_options(args)
    offset = page_offset(args)
    async with checked_database(settings) as database:
        detail = await show_run(
            database,
            args.run,
            formula=args.formula,
            run_gap_s=settings.reports.run_gap_s,
            offset=offset,
            limit=args.limit,
        )
    if args.output_format == "json":
        sys.stdout.buffer.write(_encoder.encode(detail) + b"\n")
        return 0
    print_rows([detail.run], "table", title=f"run {args.run}", zone=zone, record=True)
    print_rows(detail.tickers, "table", title="tickers")
    if detail.calls is not None:
        print_rows(detail.calls.items, "table", title="calls", zone=zone, **table)
        print(page_line(detail.calls, args.limit))
    return 0
