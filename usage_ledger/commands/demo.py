"""`ledger demo`: the emulator, the gateway and a batch shaped like the user's, then the reports (`usage_ledger.demo`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from usage_ledger.commands.decide import print_decision
from usage_ledger.commands.support import DEMO_DB_FILE, run_command
from usage_ledger.commands.ui import DEFAULT_PORT

__all__ = ("register",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        help="emulator + gateway + a seed-shaped batch on two boxes, added to a SQLite ledger, then the reports "
        "and `ledger decide` on synthetic grades",
    )
    demo.add_argument(
        "--db-file",
        default=DEMO_DB_FILE,
        help="SQLite file the runs are added to; created if missing, never deleted (default ./ledger-demo.db)",
    )
    demo.add_argument(
        "--tickers",
        type=int,
        default=100,
        help="tickers on the MoE box (default 100); the dense box, ≈8× slower per call, runs proportionally fewer",
    )
    demo.add_argument("--steps", type=int, default=17, help="calls per ticker (default 17)")
    demo.add_argument(
        "--seconds",
        type=float,
        default=90.0,
        help="real time each box's batch takes, about (default 90): both emulators' clocks run at the one speed "
        "that fits the MoE batch into it, so every rate the ledger records is that speed × the GPU's and the "
        "boxes' ratios are the GPU's",
    )
    demo.add_argument("--tz", default="Asia/Seoul", help="zone for the daily table (default Asia/Seoul)")
    demo.add_argument("--keep-running", action="store_true", help="leave the last gateway and emulator up")
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from usage_ledger.commands.output import DEFAULT_WIDTH
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
    # Off a terminal (a pipe, a CI log) rich assumes 80 columns, and the run names were cut to "moe-2…";
    # the tables are laid out for 100, what `report` assumes off a terminal too.
    console = Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=DEFAULT_WIDTH)
    return run_command(lambda: run_demo(options, console, print_decision=print_decision, ui_port=DEFAULT_PORT))
