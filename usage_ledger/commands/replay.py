"""`ledger replay RUN --upstream URL`: the command around `usage_ledger.replay.run.replay_run`.

It owns what a terminal needs: the settings (the replay's own spool beside a running `ledger
serve`'s), quiet logs under the progress bar, Ctrl-C (the first stops cleanly, a second at once),
the comparison, and the summary line printed last. Exit codes: docs/decide.md ("Replay").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator

import msgspec

from usage_ledger.commands.support import add_db_option, add_run_gap_option, checked_database, run_command

__all__ = ("register",)

CALLS_FAILED = 1
INTERRUPTED = 130


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="send a recorded run's requests to another server, recorded as a new run")
    add_db_option(p)
    p.add_argument("run", metavar="RUN")
    p.add_argument("--upstream", required=True, metavar="URL", help="the server to replay to (OpenAI-compatible)")
    p.add_argument("--model", help="send this model name in place of the recorded one")
    p.add_argument(
        "--concurrency", type=int, metavar="N", help="requests at once (default: the most RUN had in flight)"
    )
    p.add_argument("--as", dest="new_run", metavar="NEW_RUN", help="name of the new run (default RUN-replay-<n>)")
    p.add_argument("--limit", type=int, metavar="K", help="replay only the first K requests")
    p.add_argument(
        "--deadline-s",
        dest="deadline_s",
        type=float,
        metavar="S",
        help="stop (as Ctrl-C does) after S seconds, exit 1 (default 86400: a day)",
    )
    p.add_argument(
        "--call-timeout-s",
        dest="call_timeout_s",
        type=float,
        metavar="S",
        help="a call whose upstream sends nothing for S seconds fails (default LEDGER_UPSTREAM_READ_TIMEOUT_S, 600)",
    )
    p.add_argument(
        "--spool-dir",
        dest="spool_dir",
        metavar="DIR",
        help="outage spool of the replay's gateway (default: LEDGER_SPOOL_DIR + '-replay')",
    )
    add_run_gap_option(p)
    p.set_defaults(func=_replay_command)


def _replay_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from usage_ledger.answers import render_comparison
    from usage_ledger.ledger import configure_logging
    from usage_ledger.replay import DEFAULT_DEADLINE_S, ReplayOptions, compare_replay, describe, replay_run
    from usage_ledger.settings import load_settings

    if (args.concurrency is not None and args.concurrency < 1) or (args.limit is not None and args.limit < 1):
        print("ledger replay: --concurrency and --limit must be ≥ 1", file=sys.stderr)
        return 2
    deadline_s = DEFAULT_DEADLINE_S if args.deadline_s is None else args.deadline_s
    if not deadline_s > 0 or (args.call_timeout_s is not None and not args.call_timeout_s > 0):
        print("ledger replay: --deadline-s and --call-timeout-s must be > 0 seconds", file=sys.stderr)
        return 2
    if not args.upstream.startswith(("http://", "https://")):
        print(f"ledger replay: --upstream {args.upstream!r}: give an http:// or https:// URL", file=sys.stderr)
        return 2
    options = ReplayOptions(
        run=args.run,
        upstream=args.upstream.rstrip("/"),
        model=args.model,
        concurrency=args.concurrency,
        new_run=args.new_run,
        limit=args.limit,
        deadline_s=deadline_s,
        call_timeout_s=args.call_timeout_s,
    )

    async def main() -> int:
        quiet = None if "LEDGER_LOG_LEVEL" in os.environ else "warning"  # a log line per call would bury the bar
        overrides = {"database_url": args.database_url, "spool_dir": args.spool_dir, "run_gap_s": args.run_gap_s}
        settings = load_settings(os.environ, {**overrides, "log_level": quiet})
        if args.spool_dir is None:  # beside, not inside, the spool a running `ledger serve` owns
            spool_dir = f"{settings.storage.spool_dir.rstrip('/')}-replay"
            settings = msgspec.structs.replace(
                settings, storage=msgspec.structs.replace(settings.storage, spool_dir=spool_dir)
            )
        configure_logging(settings.log.log_level, settings.log.log_format)
        console = Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=160)
        async with checked_database(settings) as database:
            with _interrupts() as stop:
                result = await replay_run(
                    database,
                    options,
                    gateway_settings=settings.gateway,
                    storage=settings.storage,
                    run_gap_s=settings.reports.run_gap_s,
                    console=Console(stderr=True),
                    stop=stop,
                )
            failed = 0
            if result.sent:  # a stop before the first request leaves no run to compare
                comparison, failed = await compare_replay(database, result, settings.reports.run_gap_s)
                console.print(render_comparison(comparison, "table"), markup=False, highlight=False)
            summary = describe(result, options.upstream, failed=failed, deadline_s=options.deadline_s)
            console.print(summary, markup=False, highlight=False, soft_wrap=True)  # one line, whatever its length
        if result.interrupted:
            return INTERRUPTED
        return CALLS_FAILED if failed or result.deadline_reached or result.upstream_lost else 0

    return run_command(main)


@contextlib.contextmanager
def _interrupts() -> Iterator[asyncio.Event]:
    """The first Ctrl-C (or SIGTERM) sets the event: stop cleanly; a second one interrupts at once
    (`asyncio.run` then cancels what runs, so the gateway still closes and the writer drains)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
