"""What every layer's `ledger` subcommands share: the `--db` option, settings from the environment and
flags, running an async command with the exit codes of the CLI, opening a ledger migrated to head.

Light to import (argparse and the standard library): `ledger --help` builds every command's parser without the
ledger, the database drivers or the web stack, which each command imports when it runs (docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from usage_ledger.ledger import Database
    from usage_ledger.settings import Settings

__all__ = (
    "DEMO_DB_FILE",
    "Deferred",
    "add_db_option",
    "add_format_option",
    "add_run_gap_option",
    "async_command",
    "checked_database",
    "handler",
    "logged_settings",
    "run_command",
    "settings_from_args",
)

DEMO_DB_FILE = "ledger-demo.db"  # `ledger demo`'s ledger, in the directory it runs in


class Deferred(argparse.Action):
    """An option whose valid values live in a package `--help` must not import (the formulas): checked, with
    argparse's own message and exit 2, only when the option is given."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, valid: Callable[[], Iterable[str]], **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.valid = valid

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        allowed = sorted(self.valid())
        if values not in allowed:
            parser.error(f"argument {option_string}: invalid choice: {values!r} (choose from {', '.join(allowed)})")
        setattr(namespace, self.dest, values)


def handler(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command function `module.name`, imported when the command runs (`--help` does not pay for it)."""

    def run(args: argparse.Namespace) -> int:
        code: int = getattr(importlib.import_module(module), name)(args)
        return code

    run.__qualname__ = f"{module}.{name}"
    return run


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", dest="database_url", metavar="URL", help="database URL (else LEDGER_DATABASE_URL)")


def add_run_gap_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-gap-s", dest="run_gap_s", type=float, help="idle gap that splits untagged (auto-…) runs")


def add_format_option(parser: argparse.ArgumentParser, *choices: str) -> None:
    """`--format` (`output_format`): one of `choices`, the first by default (without any: table, json or csv)."""
    choices = choices or ("table", "json", "csv")
    parser.add_argument("--format", dest="output_format", choices=choices, default=choices[0])


def settings_from_args(args: argparse.Namespace, *names: str) -> Settings:
    """Settings from the environment, overridden by the flags named (None = flag not given)."""
    from usage_ledger.settings import load_settings

    overrides = {name: getattr(args, name, None) for name in ("database_url", *names)}
    return load_settings(os.environ, overrides)


def logged_settings(args: argparse.Namespace, *names: str) -> Settings:
    """`settings_from_args`, with logging configured from them."""
    from usage_ledger.ledger import configure_logging

    settings = settings_from_args(args, *names)
    configure_logging(settings.log.log_level, settings.log.log_format)
    return settings


def run_command(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run an async command; bad usage, bad input or an unreachable database exit with code 2."""
    from usage_ledger.ledger import LedgerError

    try:
        return asyncio.run(main())
    except LedgerError as exc:
        print(f"ledger: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def async_command(
    command: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    """A command written as a coroutine, run by `run_command`."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        return run_command(lambda: command(args))

    return run


@contextlib.asynccontextmanager
async def checked_database(settings: Settings) -> AsyncIterator[Database]:
    """The ledger database from settings, refusing (SchemaError) one not migrated to head; disposed on the way out."""
    from usage_ledger.ledger import SchemaError, StorageSettings, open_database, require_head

    storage = settings.storage
    database = open_database(
        storage.database_url,
        sqlite_synchronous=storage.sqlite_synchronous,
        pg_lock_timeout_s=storage.pg_lock_timeout_s,
        pg_idle_in_transaction_timeout_s=storage.pg_idle_in_transaction_timeout_s,
    )
    try:
        try:
            await require_head(database)
        except SchemaError as exc:
            if storage.database_url == StorageSettings().database_url and "no ledger database" in str(exc):
                raise SchemaError(f"{exc}\n{_default_ledger_hint()}") from exc
            raise
        yield database
    finally:
        await database.dispose()


def _default_ledger_hint() -> str:
    """After `ledger demo`, a bare `ledger report runs` looks for ./ledger.db: say where the ledgers are."""
    demo = Path(DEMO_DB_FILE)
    where = (
        f"the demo's ledger is here: add --db sqlite:///{demo}, or export LEDGER_DATABASE_URL=sqlite:///{demo}"
        if demo.is_file()
        else f"`ledger demo` records into ./{demo} (then --db sqlite:///{demo})"
    )
    return (
        "ledger: note: that is the default, used because neither --db nor LEDGER_DATABASE_URL names a ledger; "
        f"{where}. A gateway's ledger is the URL it was served with."
    )
