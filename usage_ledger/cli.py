"""The `ledger` command: each package contributes its subcommands; no logic lives here.

This is the composition root: the only module that knows every package, so it is where the
gateway gets the projections' follower and read API.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from litestar import Router
from rich.console import Console

from usage_ledger import replay as replay_commands
from usage_ledger.commands import gateway as gateway_commands
from usage_ledger.commands import ledger as ledger_commands
from usage_ledger.commands import otel as otel_commands
from usage_ledger.commands import projections as projections_commands
from usage_ledger.commands import ui as ui_commands
from usage_ledger.commands.support import run_command
from usage_ledger.emulator import commands as emulator_commands
from usage_ledger.followers import otel_follower_process, projections_follower_process
from usage_ledger.gateway.serve import Background
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.version import VERSION
from usage_ledger.projections.api import build_api_routers
from usage_ledger.settings import Settings
from usage_ledger.ui.routers import build_ui_routers

__all__ = ("build_parser", "main")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledger",
        description="usage-ledger: a byte-transparent gateway and an immutable usage ledger for LLM servers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    ledger_commands.register(sub)
    gateway_commands.register(sub, background=_serve_background, api=_read_api, ui=_dashboard)
    projections_commands.register(sub)
    emulator_commands.register(sub)
    ui_commands.register(sub)
    _register_demo(sub)
    replay_commands.register(sub)
    otel_commands.register(sub)
    return parser


def _serve_background(settings: Settings) -> tuple[Background, ...]:
    """The child processes `ledger serve` keeps beside the gateway: the projections, and the OTel export if asked."""
    return (projections_follower_process, *((otel_follower_process,) if settings.otel.otel_export else ()))


def _read_api(database: Database, settings: Settings) -> list[Router]:
    return build_api_routers(database, settings.reports, admin_token=settings.gateway.admin_token)


def _dashboard(database: Database, settings: Settings) -> list[Router]:
    return build_ui_routers(database, settings.reports, admin_token=settings.gateway.admin_token)


def _register_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="emulator + gateway + a seed-shaped batch, then the reports")
    demo.add_argument(
        "--db-file", default="ledger-demo.db", help="SQLite file to (re)create (default ./ledger-demo.db)"
    )
    demo.add_argument("--tickers", type=int, default=100, help="tickers per run (default 100)")
    demo.add_argument("--steps", type=int, default=17, help="calls per ticker (default 17)")
    demo.add_argument(
        "--seconds", type=float, default=45.0, help="replay each box's batch in about this many seconds (default 45)"
    )
    demo.add_argument("--tz", default="Asia/Seoul", help="zone for the daily table (default Asia/Seoul)")
    demo.add_argument("--keep-running", action="store_true", help="leave the last gateway and emulator up")
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from usage_ledger.demo import DemoOptions, run_demo

    if not 1 <= args.tickers <= 100 or args.steps < 1 or args.seconds <= 0:
        print("ledger demo: --tickers must be 1..100, --steps ≥ 1 and --seconds > 0", file=sys.stderr)
        return 2
    options = DemoOptions(
        db_path=Path(args.db_file).resolve(),
        tickers=args.tickers,
        steps=args.steps,
        seconds=args.seconds,
        tz=args.tz,
        keep_running=args.keep_running,
    )
    os.environ.setdefault("LEDGER_LOG_LEVEL", "warning")
    # Off a terminal (a pipe, a CI log) rich assumes 80 columns, and the run names were cut to "moe-2…".
    console = Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=160)
    return run_command(lambda: run_demo(options, console))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
