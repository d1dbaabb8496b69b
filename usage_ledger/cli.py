"""The `ledger` command: each package contributes its subcommands; no logic lives here.

This is the composition root: the only module that knows every package, so it is where the
gateway gets the projections' follower and read API.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from usage_ledger.commands import demo as demo_commands
from usage_ledger.commands import gateway as gateway_commands
from usage_ledger.commands import ledger as ledger_commands
from usage_ledger.commands import otel as otel_commands
from usage_ledger.commands import projections as projections_commands
from usage_ledger.commands import replay as replay_commands
from usage_ledger.commands import ui as ui_commands
from usage_ledger.emulator import register_commands as register_emulator_commands

if TYPE_CHECKING:
    from litestar import Router

    from usage_ledger.gateway import Background, RetentionPass
    from usage_ledger.ledger import Database
    from usage_ledger.settings import Settings

__all__ = ("build_parser", "main")


class _Version(argparse.Action):
    """`--version`, reading the version only when asked (`ledger --help` imports no more than the parsers)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from usage_ledger.ledger import VERSION

        print(f"{parser.prog} {VERSION}")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; a command imports what its work needs only when it runs (docs/BENCHMARKS.md)."""
    parser = argparse.ArgumentParser(
        prog="ledger",
        description="usage-ledger: a byte-transparent gateway and an immutable usage ledger for LLM servers.",
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
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
    from usage_ledger.followers import otel_follower_process, projections_follower_process

    return (projections_follower_process, *((otel_follower_process,) if settings.otel.otel_export else ()))


async def _erase_older(database: Database, days: float, after_batch: Callable[[int], None]) -> RetentionPass:
    """`ledger serve --keep-bodies DAYS`: the erasure `ledger redact --before` runs, for the calls older than DAYS."""
    from usage_ledger.commands.retention import erase_older
    from usage_ledger.gateway import RetentionPass

    done = await erase_older(database, days, after_batch=after_batch)
    return RetentionPass(erased=done.bodies, stored_bytes=done.stored_bytes, kept_shared=done.kept_shared)


def _read_api(database: Database, settings: Settings) -> list[Router]:
    from usage_ledger.answers import build_api_routers

    return build_api_routers(database, settings.reports, admin_token=settings.gateway.admin_token)


def _dashboard(database: Database, settings: Settings) -> list[Router]:
    from usage_ledger.ui import build_ui_routers

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
