"""The `ledger` command: each package contributes its subcommands; no logic lives here.

This is the composition root: the only module that knows every package, so it is where the
gateway gets the projections' follower and read API.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from litestar import Router

from usage_ledger.answers import build_api_routers
from usage_ledger.commands import demo as demo_commands
from usage_ledger.commands import gateway as gateway_commands
from usage_ledger.commands import ledger as ledger_commands
from usage_ledger.commands import otel as otel_commands
from usage_ledger.commands import projections as projections_commands
from usage_ledger.commands import replay as replay_commands
from usage_ledger.commands import retention as retention_commands
from usage_ledger.commands import ui as ui_commands
from usage_ledger.emulator import register_commands as register_emulator_commands
from usage_ledger.followers import otel_follower_process, projections_follower_process
from usage_ledger.gateway import Background, RetentionPass
from usage_ledger.ledger import VERSION, Database
from usage_ledger.settings import Settings
from usage_ledger.ui import build_ui_routers

__all__ = ("build_parser", "main")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledger",
        description="usage-ledger: a byte-transparent gateway and an immutable usage ledger for LLM servers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    ledger_commands.register(sub)
    gateway_commands.register(sub, background=_serve_background, api=_read_api, ui=_dashboard, erase_older=_erase_older)
    projections_commands.register(sub)
    register_emulator_commands(sub)
    ui_commands.register(sub)
    demo_commands.register(sub)
    replay_commands.register(sub)
    otel_commands.register(sub)
    return parser


def _serve_background(settings: Settings) -> tuple[Background, ...]:
    """The child processes `ledger serve` keeps beside the gateway: the projections, and the OTel export if asked."""
    return (projections_follower_process, *((otel_follower_process,) if settings.otel.otel_export else ()))


async def _erase_older(database: Database, days: float, after_batch: Callable[[int], None]) -> RetentionPass:
    """`ledger serve --keep-bodies DAYS`: the erasure `ledger redact --before` runs, for the calls older than DAYS."""
    done = await retention_commands.erase_older(database, days, after_batch=after_batch)
    return RetentionPass(erased=done.bodies, stored_bytes=done.stored_bytes, kept_shared=done.kept_shared)


def _read_api(database: Database, settings: Settings) -> list[Router]:
    return build_api_routers(database, settings.reports, admin_token=settings.gateway.admin_token)


def _dashboard(database: Database, settings: Settings) -> list[Router]:
    return build_ui_routers(database, settings.reports, admin_token=settings.gateway.admin_token)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # inside the try: a pipe closed early fails here, not at interpreter exit
    except BrokenPipeError:
        # `ledger … | head`: the reader has what it wanted. Stop quietly, as rich does for its tables:
        # stdout to /dev/null so the interpreter's final flush cannot fail again, exit 1 (Python's EPIPE code).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
