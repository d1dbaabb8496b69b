"""`ledger serve`: the gateway, given its settings and what the other packages add to it (parsing and running only)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from usage_ledger.commands.support import add_db_option

if TYPE_CHECKING:
    from typing import TypeAlias

    from litestar import Router

    from usage_ledger.gateway import Background, EraseOlder
    from usage_ledger.ledger import Database
    from usage_ledger.settings import Settings

    BackgroundFactory: TypeAlias = Callable[[Settings], Sequence[Background]]
    RoutersFactory: TypeAlias = Callable[[Database, Settings], Sequence[Router]]

__all__ = ("register",)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    *,
    background: BackgroundFactory,
    api: RoutersFactory,
    ui: RoutersFactory,
    erase_older: EraseOlder,
) -> None:
    """Add `ledger serve`; `background` gives the coroutines that run for the server's life (by the
    settings), `api` the read-API routers under `/_ledger/api`, `ui` the dashboard under `/_ledger/ui/`,
    `erase_older` what `--keep-bodies` runs."""
    parser = sub.add_parser("serve", help="run the recording gateway in front of an OpenAI-compatible server")
    parser.add_argument("--upstream", metavar="URL", help="upstream base URL (else LEDGER_UPSTREAM)")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default 8300)")
    parser.add_argument(
        "--durability", choices=("strict", "async"), help="strict (default): record before the last bytes"
    )
    add_db_option(parser)
    parser.add_argument(
        "--state-dir",
        dest="state_dir",
        metavar="DIR",
        help="the gateway's spool and keys (else LEDGER_STATE_DIR; default: beside a SQLite ledger, per user otherwise)",
    )
    parser.add_argument("--spool-dir", dest="spool_dir", metavar="DIR", help="outage spool (else <state dir>/spool)")
    parser.add_argument(
        "--min-body-rate",
        dest="min_body_rate",
        type=int,
        metavar="BYTES_PER_S",
        help="a request body slower than this after its first 10 s is cut with 408 (default 500; 0: no minimum; "
        "else LEDGER_MIN_BODY_RATE)",
    )
    parser.add_argument(
        "--keep-bodies",
        dest="keep_bodies_days",
        type=float,
        metavar="DAYS",
        help="erase the request and response bodies of calls older than DAYS, in the background (usage and "
        "the chain stay; else LEDGER_KEEP_BODIES_DAYS)",
    )
    parser.add_argument(
        "--no-projections",
        dest="no_background",
        action="store_true",
        help="do not keep the read models current in this process (run `ledger projections run --follow` "
        "once elsewhere, e.g. beside several replicas)",
    )
    parser.set_defaults(
        func=lambda args: _serve(args, None if args.no_background else background, api, ui, erase_older)
    )


def _serve(
    args: argparse.Namespace,
    background: BackgroundFactory | None,
    api: RoutersFactory,
    ui: RoutersFactory,
    erase_older: EraseOlder,
) -> int:
    from usage_ledger.gateway import serve
    from usage_ledger.ledger import LedgerError, configure_logging
    from usage_ledger.settings import load_settings

    names = ("upstream", "host", "port", "durability", "database_url", "state_dir", "spool_dir", "min_body_rate")
    try:
        flags = {name: getattr(args, name) for name in (*names, "keep_bodies_days")}
        settings = load_settings(os.environ, flags)
    except LedgerError as exc:
        print(f"ledger: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log.log_level, settings.log.log_format)
    signal.signal(signal.SIGTERM, _terminate)
    running = serve(
        settings.gateway,
        settings.storage,
        background=background(settings) if background is not None else (),
        api=lambda database: api(database, settings),
        ui=lambda database: ui(database, settings),
        erase_older=erase_older,
    )
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(running)
    except LedgerError as exc:
        print(f"ledger: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"ledger: error: cannot listen on {settings.gateway.host}:{settings.gateway.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _terminate(_signum: int, _frame: object) -> None:
    # While serving, `serve` handles SIGTERM itself (graceful stop); before and after that (start-up,
    # the writer's final drain) the default action would kill the process before `finally` blocks ran.
    raise SystemExit(0)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
