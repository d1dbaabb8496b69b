"""`ledger demo`: the emulator, the gateway and a batch shaped like the user's, then the reports (`usage_ledger.demo`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from usage_ledger.commands.support import run_command

__all__ = ("register",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
