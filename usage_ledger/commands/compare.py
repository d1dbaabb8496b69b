"""`ledger compare RUN RUN [RUN…]`: the command (the work is in `answers.compare`)."""

from __future__ import annotations

import argparse
import sys

from usage_ledger.commands.support import async_command, checked_database, logged_settings

__all__ = ("compare_command",)


@async_command
async def compare_command(args: argparse.Namespace) -> int:
    """Exit 0 with the comparison printed; 2 for an unknown run or bad usage."""

    from usage_ledger.answers import compare_runs, render_comparison
    from usage_ledger.commands.output import terminal_width

    settings = logged_settings(args, "run_gap_s")
    async with checked_database(settings) as database:
        comparison = await compare_runs(database, args.runs, run_gap_s=settings.reports.run_gap_s)
    text = render_comparison(comparison, args.output_format, width=terminal_width())
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
