"""`ledger compare RUN RUN [RUN…]`: the command (the work is in `answers.compare`)."""

from __future__ import annotations

import argparse
import sys

from usage_ledger.commands.support import open_checked, run_command, settings_from_args

__all__ = ("compare_command",)


def compare_command(args: argparse.Namespace) -> int:
    """Exit 0 with the comparison printed; 2 for an unknown run or bad usage."""

    from usage_ledger.answers import compare_runs, render_comparison
    from usage_ledger.commands.output import terminal_width
    from usage_ledger.ledger import configure_logging

    async def main() -> int:
        settings = settings_from_args(args, "run_gap_s")
        configure_logging(settings.log.log_level, settings.log.log_format)
        database = await open_checked(settings)
        try:
            comparison = await compare_runs(database, args.runs, run_gap_s=settings.reports.run_gap_s)
        finally:
            await database.dispose()
        text = render_comparison(comparison, args.output_format, width=terminal_width())
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0

    return run_command(main)
