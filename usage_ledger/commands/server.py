"""`ledger reconcile` and `ledger audit`: a run against what the server itself said (docs/server.md)."""

from __future__ import annotations

import argparse
import sys
import textwrap

import msgspec

from usage_ledger.answers import audit_run, runs_report
from usage_ledger.commands.output import print_rows, terminal_width
from usage_ledger.commands.support import async_command, checked_database, logged_settings
from usage_ledger.projections import RunRow

__all__ = ("audit_command", "reconcile_command")


class ReconcileRow(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    reconciled: bool | None
    calls: int
    window_calls: int | None
    """The completed calls recorded in the reconciliation window: this run's and those of the runs checked with it."""
    server_requests: int | None
    requests_difference: int | None
    """Server minus ledger: > 0 reached the server without passing through this gateway."""
    prompt_tokens_difference: int | None
    generation_tokens_difference: int | None
    restarts: int
    note: str


def _row(run: RunRow) -> ReconcileRow:
    server = run.server
    difference = server.difference if server is not None else None
    together = (
        f" (checked together with {', '.join(server.reconciled_with)}, sent back to back)"
        if server and server.reconciled_with
        else ""
    )
    if server is None:
        note = "not sampled (no server.sampled events around the run)"
    elif server.reconciled is None:
        note = server.reconcile_note or "no idle counter sample on both sides of the run"
    elif server.reconciled:
        note = "equal" + together
    elif server.reconciled_with:
        note = (
            f"differs in the window shared with {', '.join(server.reconciled_with)}: positive = the server saw more "
            "than the ledger (traffic that bypassed the gateway) while these runs ran; which of them cannot be told"
        )
    else:
        note = "differs: positive = the server saw more than the ledger (traffic that bypassed the gateway)"
    return ReconcileRow(
        run=run.run,
        reconciled=server.reconciled if server is not None else None,
        calls=run.calls - run.failed_calls - run.incomplete_calls,
        window_calls=(
            server.server_requests - difference.requests
            if server is not None and server.server_requests is not None and difference is not None
            else None
        ),
        server_requests=server.server_requests if server is not None else None,
        requests_difference=difference.requests if difference is not None else None,
        prompt_tokens_difference=difference.prompt_tokens if difference is not None else None,
        generation_tokens_difference=difference.generation_tokens if difference is not None else None,
        restarts=server.restarts if server is not None else 0,
        note=note,
    )


@async_command
async def reconcile_command(args: argparse.Namespace) -> int:
    """Exit 0 when every run checked reconciles, 1 when one does not (2: bad usage)."""

    settings = logged_settings(args, "run_gap_s")
    async with checked_database(settings) as database:
        runs = await runs_report(database, run=args.run, run_gap_s=settings.reports.run_gap_s)
    rows = [_row(r) for r in runs]
    shown = rows if args.run is not None or args.all else [r for r in rows if r.reconciled is False]
    only_failing = args.run is None and not args.all
    print_rows(shown, args.output_format, title="runs that do not reconcile" if only_failing else "reconcile")
    unchecked = sum(r.reconciled is None for r in rows)
    if args.output_format == "table" and unchecked and args.run is None:
        print(f"{unchecked} of {len(rows)} runs could not be checked (--all lists them)", file=sys.stderr)
    return 1 if any(r.reconciled is False for r in rows) else 0


@async_command
async def audit_command(args: argparse.Namespace) -> int:
    """Exit 0 when there is nothing to report, 1 when there is (2: bad usage, an unknown run)."""

    settings = logged_settings(args, "run_gap_s")
    async with checked_database(settings) as database:
        report = await audit_run(database, args.run, against=args.against, run_gap_s=settings.reports.run_gap_s)
    if args.output_format == "json":
        sys.stdout.buffer.write(msgspec.json.encode(report) + b"\n")
    elif report.findings:  # one finding a paragraph: a table cell would cut the values that differ
        print(f"audit of {report.run}" + (f" against {report.against}" if report.against else ""))
        for finding in report.findings:
            print(textwrap.fill(f"{finding.kind}: {finding.detail}", terminal_width(), subsequent_indent="    "))
    else:
        print(f"{report.run}: nothing to report")
    return 1 if report.findings else 0
