"""`ledger ui --db URL [--host H] [--port N]`: the dashboard alone over any ledger, no gateway.

It appends nothing to the ledger. Unless `--no-refresh`, it brings the projections (derived read
models, rebuildable at any time) up to the head before it answers, at most every 2 s, as
`ledger report` does; with `--no-refresh` it only reads (e.g. beside a `ledger serve` that follows).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from usage_ledger.commands.support import add_db_option, run_command, settings_from_args

__all__ = ("DEFAULT_PORT", "register")

DEFAULT_PORT = 8301
"""Beside the gateway's 8300."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("ui", help="serve the dashboard over a ledger, without the gateway (appends no event)")
    add_db_option(parser)
    parser.add_argument("--host", help="listen address (default 127.0.0.1, or LEDGER_HOST)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--no-refresh", action="store_true", help="never catch the projections up (read them as they are)"
    )
    parser.set_defaults(func=_ui)


def _missing_ledger_file(url: str) -> Path | None:
    """A ledger file that does not exist (opening it would leave an empty file behind)."""
    from usage_ledger.ledger import ledger_file

    file = ledger_file(url)
    return None if file is None or Path(file).exists() else Path(file)


def _ui(args: argparse.Namespace) -> int:
    from usage_ledger.gateway import bind_socket, serve_asgi
    from usage_ledger.ledger import ConfigError, LedgerError, configure_logging, open_database, require_head
    from usage_ledger.ui import create_ui_app

    async def main() -> int:
        settings = settings_from_args(args, "host")
        configure_logging(settings.log.log_level, settings.log.log_format)
        missing = _missing_ledger_file(settings.storage.database_url)
        if missing is not None:
            raise LedgerError(
                f"no ledger at {missing}: give --db URL of an existing ledger (or run `ledger db upgrade`)"
            )
        database = open_database(settings.storage.database_url)
        try:
            await require_head(database)
            app = create_ui_app(
                database, settings.reports, admin_token=settings.gateway.admin_token, refresh=not args.no_refresh
            )
            try:
                sock = bind_socket(settings.gateway.host, args.port)
            except OSError as exc:
                raise ConfigError(
                    f"cannot listen on {settings.gateway.host}:{args.port}: {exc.strerror or exc}; give another --port"
                ) from None
            print(
                f"ledger ui: http://{settings.gateway.host}:{args.port}/_ledger/ui/ over {database.safe_url}",
                flush=True,
            )
            try:
                await serve_asgi(app, settings.gateway, sock)  # the gateway's server, under its limits
            finally:
                sock.close()
        finally:
            await database.dispose()
        return 0

    return run_command(main)
