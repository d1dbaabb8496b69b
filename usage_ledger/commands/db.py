"""`ledger db upgrade|current|history|downgrade`: the schema's revision, with Alembic."""

from __future__ import annotations

import argparse

from usage_ledger.commands.support import add_db_option, async_command, logged_settings, settings_from_args

__all__ = ("register_db",)


def register_db(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    upgrade = db_sub.add_parser("upgrade", help="migrate the schema to the newest revision")
    add_db_option(upgrade)
    upgrade.set_defaults(func=_db_upgrade)
    current = db_sub.add_parser("current", help="the schema revision of the database, and whether it is the newest")
    add_db_option(current)
    current.set_defaults(func=_db_current)
    history = db_sub.add_parser("history", help="every schema revision of this release, newest first")
    history.set_defaults(func=_db_history)
    downgrade = db_sub.add_parser("downgrade", help="undo schema revisions down to REV (or base)")
    add_db_option(downgrade)
    downgrade.add_argument("revision", metavar="REV", help="the revision to go back to (see `ledger db history`)")
    downgrade.add_argument(
        "--yes", action="store_true", help="confirm a downgrade that drops the ledger's own tables (all events)"
    )
    downgrade.set_defaults(func=_db_downgrade)


@async_command
async def _db_upgrade(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import open_database, upgrade_database

    settings = logged_settings(args)
    database = open_database(settings.storage.database_url, sqlite_synchronous=settings.storage.sqlite_synchronous)
    try:
        await upgrade_database(database)
    finally:
        await database.dispose()
    print(f"ledger schema is up to date in {database.safe_url}")
    return 0


@async_command
async def _db_current(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import current_revision, database_exists, head_revision, open_database

    settings = settings_from_args(args)
    database = open_database(settings.storage.database_url, sqlite_synchronous=settings.storage.sqlite_synchronous)
    try:
        revision = await current_revision(database)
    finally:
        await database.dispose()
    head = head_revision()
    if not database_exists(database):
        state = "no database file (create it with `ledger db upgrade`)"
    elif revision is None:
        state = "none: not migrated (run `ledger db upgrade`)"
    else:
        state = revision + (" (head)" if revision == head else f" (head is {head}: run `ledger db upgrade`)")
    print(f"{database.safe_url}: {state}")
    return 0 if revision == head else 1


def _db_history(_: argparse.Namespace) -> int:
    from usage_ledger.ledger import revision_history

    for rev in revision_history():
        print(f"{rev.down_revision or 'base'} -> {rev.revision}{' (head)' if rev.is_head else ''}: {rev.doc}")
    return 0


@async_command
async def _db_downgrade(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import (
        ConfigError,
        current_revision,
        database_exists,
        downgrade_database,
        downgrade_steps,
        open_database,
    )

    settings = logged_settings(args)
    database = open_database(settings.storage.database_url, sqlite_synchronous=settings.storage.sqlite_synchronous)
    try:
        if not database_exists(database):
            raise ConfigError(f"no ledger database at {database.safe_url}: nothing to downgrade")
        steps = downgrade_steps(await current_revision(database), args.revision)
        if any(step.down_revision is None for step in steps) and not args.yes:
            raise ConfigError(
                f"downgrading {database.safe_url} to {args.revision} drops the ledger's own tables and every "
                "event in them; pass --yes if that is what you want (export or back up first)"
            )
        if steps:
            await downgrade_database(database, args.revision)
    finally:
        await database.dispose()
    if not steps:
        print(f"{database.safe_url}: already at {args.revision}, nothing undone")
    for step in steps:
        print(f"undone {step.revision}: {step.doc}")
    return 0
