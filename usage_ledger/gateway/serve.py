"""Running the gateway: database, writer, upstream client, background tasks and the HTTP server.

    serve(settings, storage)  ─ require_head ─ gateway_app: EventWriter(+spool), the shared upstream
                                client (Upstream: http:// and verified https://), ServerSampler, create_app
                     └ background tasks (the projections follower and the OTel export, child processes)
                     └ listening: HttpServer (gateway._http: asyncio protocols, httptools, uvloop) on a
                       socket with TCP_NODELAY; SIGTERM / SIGINT stop it gracefully

`ledger replay` records through the same `gateway_app` and `listening`, in its own process.

Resources are opened here and closed in `finally`, in reverse order; the writer drains its queue
before the database is disposed, so nothing accepted is dropped on a clean shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog
from litestar import Router

from usage_ledger.gateway._http import Exchange, HttpServer, Request, Upstream, run_asgi
from usage_ledger.gateway.app import GatewayApp, create_app
from usage_ledger.gateway.fingerprint_key import FingerprintKey, key_file_path, load_fingerprint_key
from usage_ledger.gateway.limits import ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.retention import EraseOlder, keep_bodies
from usage_ledger.gateway.sampler import ServerSampler
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.gateway.state import adopt_legacy_state
from usage_ledger.ledger import (
    Checkpointer,
    ConfigError,
    Database,
    DatabaseUnavailable,
    EventWriter,
    Spool,
    StorageSettings,
    freeze_startup_heap,
    open_database,
    require_head,
    require_head_in_step,
    wait_up_to,
)

__all__ = ("ApiFactory", "Background", "bind_socket", "gateway_app", "listening", "serve", "serve_asgi")

Background = Callable[[Database], Coroutine[Any, Any, None]]
ApiFactory = Callable[[Database], Sequence[Router]]
log = structlog.get_logger("gateway.serve")


GIL_SWITCH_INTERVAL_S = 0.0005
"""How long the event loop may wait for the GIL while the SQLite appender thread runs Python (default
5 ms): a response that arrived waited behind the previous call's commit; 0.5 ms bounds that wait."""
GRACEFUL_SHUTDOWN_S = 30.0
"""On SIGTERM / SIGINT, calls in flight get this long to finish before their connections are closed."""


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket; accepted connections inherit TCP_NODELAY (no Nagle delay on small chunks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(
    settings: GatewaySettings,
    storage: StorageSettings,
    *,
    background: Sequence[Background] = (),
    api: ApiFactory | None = None,
    ui: ApiFactory | None = None,
    erase_older: EraseOlder | None = None,
) -> None:
    """Run the gateway until interrupted. `api` builds extra read-API routers once the database is open,
    `ui` the dashboard's routers (mounted under `/_ledger/ui/`), `erase_older` the erasure `keep_bodies_days`
    runs (`gateway.retention`).

    The port is bound first: a start that fails there (a busy port) creates nothing; then the state directory
    (`gateway.state`), the database, the key, the writer and its spool."""
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}; "
            "stop what uses that port, or give another with --port / LEDGER_PORT"
        ) from None
    with sock:
        adopt_legacy_state(storage, settings, Path.cwd())
        await _serve_on(sock, settings, storage, background=background, api=api, ui=ui, erase_older=erase_older)


async def _serve_on(
    sock: socket.socket,
    settings: GatewaySettings,
    storage: StorageSettings,
    *,
    background: Sequence[Background],
    api: ApiFactory | None,
    ui: ApiFactory | None,
    erase_older: EraseOlder | None,
) -> None:
    database = open_database(
        storage.database_url,
        sqlite_synchronous=storage.sqlite_synchronous,
        pg_lock_timeout_s=storage.pg_lock_timeout_s,
        pg_idle_in_transaction_timeout_s=storage.pg_idle_in_transaction_timeout_s,
    )
    try:
        try:
            await require_head(database)
            await require_head_in_step(database)  # appending onto a head out of step would gap or fork the chain
        except DatabaseUnavailable as exc:
            log.warning("database_unavailable_at_start", error=str(exc), spool=storage.spool_dir)
        # an unusable key file stops the start (exit 2)
        fingerprint_key = load_fingerprint_key(settings, storage.spool_dir)
        checkpointer = Checkpointer.from_settings(storage, database)  # None unless LEDGER_CHECKPOINT_KEY is set
        tasks = [asyncio.create_task(job(database), name=f"background-{i}") for i, job in enumerate(background)]
        if checkpointer is not None:
            checkpointer.start()
        try:
            api_routers = api(database) if api is not None else ()
            ui_routers = ui(database) if ui is not None else ()
            async with gateway_app(
                settings,
                storage,
                database,
                fingerprint_key=fingerprint_key,
                api_routers=api_routers,
                ui_routers=ui_routers,
            ) as app:
                retention = []
                if erase_older is not None and settings.keep_bodies_days is not None:
                    erasing = keep_bodies(
                        database, settings.keep_bodies_days, settings.keep_bodies_interval_s, erase_older, app.metrics
                    )
                    retention.append(asyncio.create_task(erasing, name="keep-bodies"))
                freeze_startup_heap()
                sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
                try:
                    await _run_server(app, settings, storage, sock)
                finally:
                    await _stop_tasks(retention)
        finally:
            await _stop_tasks(tasks)
        if checkpointer is not None:
            await checkpointer.close()  # after the writer drained: the final checkpoint covers every call
    finally:
        await database.dispose()


@contextlib.asynccontextmanager
async def gateway_app(
    settings: GatewaySettings,
    storage: StorageSettings,
    database: Database,
    *,
    fingerprint_key: FingerprintKey | None = None,
    api_routers: Sequence[Router] = (),
    ui_routers: Sequence[Router] = (),
) -> AsyncIterator[GatewayApp]:
    """The gateway, ready for calls: its writer (with the outage spool), upstream client and server sampler.

    The one composition of the recording path, for `serve` and for `ledger replay`'s in-process
    gateway. On exit, after the last call: the run's closing sample, then the writer drains its queue.
    """
    writer = EventWriter(database, Spool(storage.spool_dir), batch_max_events=storage.batch_max_events)
    async with writer:
        client = Upstream(settings)
        sampler = ServerSampler(settings, writer)  # off when LEDGER_SERVER_SAMPLE_S=0
        sampling = asyncio.create_task(sampler.run(), name="server-sampler")
        try:
            app = create_app(
                settings,
                database=database,
                writer=writer,
                upstream=client,
                api_routers=api_routers,
                fingerprint_key=fingerprint_key,
                ui_routers=ui_routers,
            )
            app.proxy.recorder.watcher = sampler
            await wait_up_to(sampler.ready.wait(), settings.server_sample_timeout_s + 1)
            yield app
        finally:
            await sampler.last_sample()  # the calls are done: the last run's closing sample
            await _stop_tasks([sampling])
            await client.aclose()


@contextlib.asynccontextmanager
async def listening(
    app: GatewayApp, settings: GatewaySettings, sock: socket.socket, *, grace_s: float
) -> AsyncIterator[HttpServer]:
    """`app` served on `sock`; on exit, calls in flight get `grace_s` to finish before their connections close."""
    server = HttpServer(app.handle, ServerLimits.from_settings(settings), app.metrics)
    await server.start(sock)
    try:
        yield server
    finally:
        await server.shutdown(grace_s)


async def serve_asgi(app: Any, settings: GatewaySettings, sock: socket.socket) -> None:
    """An ASGI app (no lifespan) on the gateway's HTTP server, under its limits, until SIGTERM or SIGINT:
    the product's one server, for `ledger ui`'s standalone dashboard."""

    async def handle(request: Request, exchange: Exchange) -> None:
        await run_asgi(app, request, exchange)

    stop = asyncio.Event()
    server = HttpServer(handle, ServerLimits.from_settings(settings), Metrics())
    with _signals_handled(stop.set):
        await server.start(sock)
        try:
            await stop.wait()
        finally:
            await server.shutdown(GRACEFUL_SHUTDOWN_S)


async def _stop_tasks(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def _run_server(
    app: GatewayApp, settings: GatewaySettings, storage: StorageSettings, sock: socket.socket
) -> None:
    # The handlers go in before the socket answers: an orchestrator that sends SIGTERM as soon as
    # `/_ledger/health` first answers still gets the graceful stop. They stay until the server has shut
    # down, so a second signal during the grace period closes the calls in flight at once.
    stop = asyncio.Event()
    server: HttpServer | None = None

    def on_signal() -> None:
        if stop.is_set() and server is not None:
            server.force_close()  # a second signal: do not wait for the calls in flight
        stop.set()

    with _signals_handled(on_signal):
        async with listening(app, settings, sock, grace_s=GRACEFUL_SHUTDOWN_S) as server:
            log.info(
                "gateway_listening",
                host=settings.host,
                port=sock.getsockname()[1],
                upstream=settings.upstream,
                durability=settings.durability,
                max_connections=server.limits.max_connections,
                **_state_paths(settings, storage),
            )
            await stop.wait()
            log.info("gateway_stopping", connections=server.connections)


def _state_paths(settings: GatewaySettings, storage: StorageSettings) -> dict[str, str]:
    """Where the gateway keeps its state, for the start-up line (not in an async function: blocking os.path)."""
    return {
        "state_dir": os.path.abspath(storage.state_dir),
        "spool": os.path.abspath(storage.spool_dir),
        "fingerprint_key": str(key_file_path(settings, storage.spool_dir)[0]),
    }


@contextlib.contextmanager
def _signals_handled(on_signal: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call `on_signal` in the loop; the handlers found are put back on exit."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous[sig])
