"""What every layer's `ledger` subcommands share: the `--db` option, settings from the environment and
flags, running an async command with the exit codes of the CLI, opening a ledger migrated to head."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from usage_ledger.ledger import Database, LedgerError, SchemaError, StorageSettings, open_database, require_head
from usage_ledger.settings import Settings, load_settings

__all__ = ("DEMO_DB_FILE", "add_db_option", "open_checked", "run_command", "settings_from_args")

DEMO_DB_FILE = "ledger-demo.db"  # `ledger demo`'s ledger, in the directory it runs in


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
    except SchemaError as exc:
        await database.dispose()
        if storage.database_url == StorageSettings().database_url and "no ledger database" in str(exc):
            raise SchemaError(f"{exc}\n{_default_ledger_hint()}") from exc
        raise
    except BaseException:
        await database.dispose()
        raise
    return database


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
