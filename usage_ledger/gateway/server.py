"""The gateway's HTTP server: uvicorn (httptools) on a bound socket, under `gateway.connections`' limits.

    GatewayServer.start(sock)  ─ uvicorn.Server: the ASGI app, no lifespan, no access log, no
                                 Server or Date header of its own (responses are the upstream's)
    GatewayServer.shutdown()   ─ stop accepting, close idle connections, let requests in flight finish
                                 (up to the grace period), then cancel them (recorded as clients leaving)

Signals are the caller's (`gateway.serve`): uvicorn's own handlers would re-raise the signal after
stopping, ending the process before the writer drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from usage_ledger.gateway.connections import ConnectionGuard, GuardedHttpProtocol
from usage_ledger.gateway.limits import ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.settings import GatewaySettings

__all__ = ("GatewayServer",)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the gateway's own handlers decide (`gateway.serve._until_signalled`)


class GatewayServer:
    """The ASGI `app` served on a listening socket."""

    def __init__(self, app: Any, settings: GatewaySettings, metrics: Metrics, *, grace_s: float) -> None:
        self.limits = ServerLimits.from_settings(settings)
        self.guard = ConnectionGuard(self.limits, metrics)
        config = uvicorn.Config(
            app,
            http=functools.partial(GuardedHttpProtocol, guard=self.guard),  # type: ignore[arg-type]
            ws="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            date_header=False,
            timeout_keep_alive=settings.keepalive_idle_s,  # type: ignore[arg-type]  # a float works
            timeout_graceful_shutdown=grace_s,  # type: ignore[arg-type]
            backlog=2048,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def connections(self) -> int:
        return len(self.guard.open)

    async def start(self, sock: socket.socket) -> None:
        """Serve on `sock`, bound and listening (`gateway.serve.bind_socket`)."""
        server = self._server
        self._task = task = asyncio.create_task(server.serve(sockets=[sock]), name="gateway-server")
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise RuntimeError("the gateway's server stopped while starting")
            await asyncio.sleep(0.005)

    def force_close(self) -> None:
        """End a graceful shutdown now: requests still running are cancelled."""
        self._server.force_exit = True
        for task in list(self._server.server_state.tasks):
            task.cancel()

    async def shutdown(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
