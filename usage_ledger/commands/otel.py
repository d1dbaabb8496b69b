"""`ledger otel export [--follow]`: send committed calls as OpenTelemetry spans and metrics."""

from __future__ import annotations

import argparse

from usage_ledger.commands.support import add_db_option, async_command, checked_database, settings_from_args

__all__ = ("register",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("otel", help="OpenTelemetry export of recorded calls (OTEL_EXPORTER_OTLP_* configure it)")
    actions = p.add_subparsers(dest="otel_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="export committed calls after the export checkpoint")
    add_db_option(export)
    export.add_argument("--follow", "-f", action="store_true", help="keep exporting calls as they are committed")
    export.set_defaults(func=_export_command)


@async_command
async def _export_command(args: argparse.Namespace) -> int:
    from usage_ledger.otel import export_once, follow_export, open_exporters

    exporters = open_exporters()
    try:
        async with checked_database(settings_from_args(args)) as database:
            if args.follow:
                await follow_export(database, exporters)
            position = await export_once(database, exporters)
    finally:
        exporters.shutdown()
    print(f"otel: exported up to position {position}")
    return 0
