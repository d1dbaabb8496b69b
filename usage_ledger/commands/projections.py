"""`ledger` subcommands of the projections package (parsers only; the work is in `reports`, `server`,
`compare` and `agreement`)."""

from __future__ import annotations

import argparse

from usage_ledger.commands.agreement import add_agreement_parser
from usage_ledger.commands.compare import compare_command
from usage_ledger.commands.decide import add_decide_parsers
from usage_ledger.commands.support import Deferred, add_db_option, add_format_option, add_run_gap_option, handler

__all__ = ("register",)


def _positive_int(text: str) -> int:
    """argparse type: a whole number of 1 or more (the error names the value)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def _formulas() -> list[str]:
    from usage_ledger.projections import FORMULAS

    return sorted(FORMULAS)


def _formula_option(parser: argparse.ArgumentParser, help: str, *, required: bool = False) -> None:
    parser.add_argument(
        "--formula",
        action=Deferred,
        valid=_formulas,
        metavar="NAME",
        required=required,
        help=f"{help} (docs/formulas.md)",
    )


def _filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="WHEN", help="calls started at or after (ISO date/time; local per --tz)")
    parser.add_argument("--until", metavar="WHEN", help="calls started before (a bare date: through that day)")
    parser.add_argument("--model", help="only calls of this model")
    parser.add_argument(
        "--status",
        metavar="S[,S]",
        help="only calls with these statuses, comma-separated (ok, error, failed, incomplete)",
    )


def _column_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--columns", metavar="A,B,…", help="table: exactly these fields (any field of the row)")
    parser.add_argument("--wide", action="store_true", help="table: every field, even past the terminal width")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this package's subcommands to the `ledger` parser."""
    p = sub.add_parser("import", help="import historical calls from JSONL or CSV files (atomic per file)")
    add_db_option(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--format", dest="input_format", choices=("jsonl", "csv"), help="default: from the extension")
    p.add_argument("--source", help="source name recorded with each call (default: the file name)")
    p.add_argument("--skip-invalid", action="store_true", help="import the valid rows of a file with bad rows")
    p.set_defaults(func=handler("usage_ledger.commands.reports", "import_command"))

    p = sub.add_parser("report", help="runs, tickers, daily totals, or eras (runs grouped by a label)")
    add_db_option(p)
    p.add_argument("kind", choices=("runs", "tickers", "daily", "eras"))
    p.add_argument("--by", metavar="LABEL", help="eras: the annotation label to group runs by (e.g. hardware)")
    p.add_argument("--kind", dest="run_kind", metavar="KIND", help="eras: only runs labelled kind=KIND")
    p.add_argument("--run", help="only this run (an X-Ledger-Run value or an auto-… name)")
    p.add_argument("--tz", help="IANA time zone for days and times (else LEDGER_TZ)")
    _formula_option(p, "throughput formula (default: the promoted one)")
    p.add_argument("--weekday-mean", action="store_true", help="daily: mean per weekday instead of per day")
    add_run_gap_option(p)
    _filter_options(p)
    _column_options(p)
    add_format_option(p)
    p.set_defaults(func=handler("usage_ledger.commands.reports", "report_command"))

    p = sub.add_parser("reconcile", help="runs whose calls and tokens differ from the server's own counters")
    add_db_option(p)
    p.add_argument("--run", help="only this run (shown whatever its result)")
    p.add_argument("--all", action="store_true", help="list every run, also those that reconcile or were not sampled")
    add_run_gap_option(p)
    add_format_option(p)
    p.set_defaults(func=handler("usage_ledger.commands.server", "reconcile_command"))

    p = sub.add_parser("audit", help="sampling and server config that vary within a run, or between two runs")
    add_db_option(p)
    p.add_argument("run", metavar="RUN")
    p.add_argument("--against", metavar="RUN2", help="also list what differs from this run")
    add_run_gap_option(p)
    add_format_option(p, "table", "json")
    p.set_defaults(func=handler("usage_ledger.commands.server", "audit_command"))

    p = sub.add_parser("compare", help="runs side by side: throughput, in flight, vllm bench serve latency, server")
    add_db_option(p)
    p.add_argument("runs", nargs="+", metavar="RUN", help="two or more runs; ratios are against the first")
    add_run_gap_option(p)
    add_format_option(p, "table", "json")
    p.set_defaults(func=compare_command)

    add_agreement_parser(sub)  # its many options live beside its work (`commands.agreement`)
    add_decide_parsers(sub)  # labels import, returns import, decide (`commands.decide`)

    p = sub.add_parser("rebuild", help="rebuild projections from position 0 beside the live version, then promote")
    add_db_option(p)
    p.add_argument("names", nargs="*", metavar="NAME", help="projections to rebuild (default: all)")
    _formula_option(p, "promote with this default formula")
    p.add_argument("--keep-old", action="store_true", help="keep the previous version's rows")
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="worker processes that fold the calls between them, each a hash range of call ids (default 1: "
        "one process, leaving the other cores to a live gateway)",
    )
    p.set_defaults(func=handler("usage_ledger.commands.reports", "rebuild_command"))

    p = sub.add_parser("projections", help="run projections or show their status")
    actions = p.add_subparsers(dest="projections_command", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="apply new events to the live projections")
    add_db_option(run)
    run.add_argument("--follow", "-f", action="store_true", help="keep applying events as they are committed")
    run.set_defaults(func=handler("usage_ledger.commands.reports", "projections_run_command"))
    status = actions.add_parser("status", help="versions, checkpoints and lag")
    add_db_option(status)
    add_format_option(status)
    status.set_defaults(func=handler("usage_ledger.commands.reports", "projections_status_command"))

    p = sub.add_parser("recompute", help="show every run under the current and another formula side by side")
    add_db_option(p)
    _formula_option(p, "the formula to compare with the promoted one", required=True)
    p.add_argument("--promote", action="store_true", help="make this formula the default afterwards")
    add_run_gap_option(p)
    add_format_option(p)
    p.set_defaults(func=handler("usage_ledger.commands.reports", "recompute_command"))

    p = sub.add_parser("annotate", help="label a run or a time range (hardware, model, kind, price per hour)")
    add_db_option(p)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", help="the run to label")
    target.add_argument("--from", dest="start", metavar="TIME", help="start of a time range (ISO 8601 with offset)")
    p.add_argument("--to", dest="end", metavar="TIME", help="end of the time range (exclusive; default open)")
    p.add_argument("--hardware")
    p.add_argument("--model")
    p.add_argument("--kind", choices=("nightly", "comparison"))
    p.add_argument(
        "--price-per-hour",
        dest="price_per_hour",
        metavar="P",
        help="what an hour of the server costs (with --currency): eras, compare and decide show what runs cost",
    )
    p.add_argument("--currency", metavar="C", help="the price's currency, e.g. USD (with --price-per-hour)")
    p.add_argument("--label", action="append", default=[], metavar="NAME=VALUE")
    add_run_gap_option(p)
    p.add_argument("--force", action="store_true", help="label a run that no recorded call carries (yet)")
    p.set_defaults(func=handler("usage_ledger.commands.reports", "annotate_command"))

    p = sub.add_parser("retag", help="correct a call's run or tags (appends call.retagged; history stays)")
    add_db_option(p)
    p.add_argument("call_id", metavar="CALL")
    p.add_argument("--run")
    p.add_argument("--tag", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--remove-tag", action="append", default=[], metavar="NAME")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=handler("usage_ledger.commands.reports", "retag_command"))

    p = sub.add_parser("export", help="export calls as JSONL, CSV or Parquet")
    add_db_option(p)
    add_format_option(p, "jsonl", "csv", "parquet")
    p.add_argument("--run")
    p.add_argument("--output", "-o", metavar="FILE", help="write here (default: stdout; parquet needs a file)")
    add_run_gap_option(p)
    p.add_argument("--tz", help="IANA time zone for --since/--until without an offset (else LEDGER_TZ)")
    p.add_argument(
        "--since-position",
        dest="since_position",
        type=int,
        metavar="N",
        help="only calls changed after position N (the position an earlier export printed)",
    )
    p.add_argument(
        "--clickhouse-schema",
        action="store_true",
        help="print the ClickHouse table the export loads into (CREATE TABLE) and exit",
    )
    p.add_argument("--table", help="the table --clickhouse-schema names: NAME or DATABASE.NAME (default ledger_calls)")
    _filter_options(p)
    p.set_defaults(func=handler("usage_ledger.commands.reports", "export_command"))

    p = sub.add_parser("show", help="one call (with bodies) or one run")
    what = p.add_subparsers(dest="show_command", metavar="WHAT", required=True)
    call = what.add_parser("call", help="a call's row, events and request/response bodies")
    add_db_option(call)
    call.add_argument("call_id", metavar="ID")
    call.add_argument("--no-bodies", action="store_true", help="leave out the request and response bodies")
    call.add_argument(
        "--full", action="store_true", help="bodies in full (else each line clipped to the terminal, 40 lines a body)"
    )
    call.add_argument("--tz", help="IANA time zone for times (else LEDGER_TZ)")
    _column_options(call)
    add_format_option(call, "text", "json")
    call.set_defaults(func=handler("usage_ledger.commands.reports", "show_call_command"))
    run_p = what.add_parser("run", help="a run's report row, its tickers and its calls (paged)")
    add_db_option(run_p)
    run_p.add_argument("run", metavar="R")
    _formula_option(run_p, "throughput formula (default: the promoted one)")
    run_p.add_argument("--tz")
    add_run_gap_option(run_p)
    run_p.add_argument("--limit", type=int, default=20, help="calls a page, 1..1000 (default %(default)s)")
    paging = run_p.add_mutually_exclusive_group()
    paging.add_argument("--offset", type=int, default=0, help="calls to skip")
    paging.add_argument("--page", type=int, help="page number (from 1) of --limit calls")
    _column_options(run_p)
    add_format_option(run_p, "table", "json")
    run_p.set_defaults(func=handler("usage_ledger.commands.reports", "show_run_command"))
