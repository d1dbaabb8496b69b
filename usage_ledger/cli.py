"""The `ledger` command: each package contributes its subcommands; no logic lives here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from emulator import commands as emulator_commands
from gateway import commands as gateway_commands
from ledger import commands as ledger_commands
from projections import commands as projections_commands

__all__ = ("build_parser", "main")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledger",
        description="usage-ledger: a byte-transparent gateway and an immutable usage ledger for LLM servers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (ledger_commands, gateway_commands, projections_commands, emulator_commands):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
