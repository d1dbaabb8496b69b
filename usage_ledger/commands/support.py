"""What every layer's `ledger` subcommands share: the `--db` option, settings from the environment and
flags, running an async command with the exit codes of the CLI, opening a ledger migrated to head."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from usage_ledger.ledger import Database, LedgerError, open_database, require_head
from usage_ledger.settings import Settings, load_settings

__all__ = ("add_db_option", "open_checked", "run_command", "settings_from_args")


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", dest="database_url", metavar="URL", help="database URL (else LEDGER_DATABASE_URL)")


def settings_from_args(args: argparse.Namespace, *names: str) -> Settings:
    """Settings from the environment, overridden by the flags named (None = flag not given)."""
    overrides = {name: getattr(args, name, None) for name in ("database_url", *names)}
    return load_settings(os.environ, overrides)


def run_command(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run an async command; bad usage, bad input or an unreachable database exit with code 2."""
    try:
        return asyncio.run(main())
    except LedgerError as exc:
        print(f"ledger: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


async def open_checked(settings: Settings) -> Database:
    """The ledger database from settings, refusing (SchemaError) one not migrated to head."""
    storage = settings.storage
    database = open_database(
        storage.database_url,
        sqlite_synchronous=storage.sqlite_synchronous,
        pg_lock_timeout_s=storage.pg_lock_timeout_s,
        pg_idle_in_transaction_timeout_s=storage.pg_idle_in_transaction_timeout_s,
    )
    try:
        await require_head(database)
    except BaseException:
        await database.dispose()
        raise
    return database
