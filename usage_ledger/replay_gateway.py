"""The gateway a replay records through: the real one, in this process, on a loopback port.

Why in-process and over a socket, rather than a subprocess or a second recording path:
- Same code as `ledger serve`: `create_app` (proxy, usage injection, recorder), `HttpServer`
  (the socket server), the upstream client `ledger serve` uses (`RawUpstream`), the
  `EventWriter` with its spool and the `ServerSampler`, composed as `gateway.serve.serve` composes
  them. A replayed call is recorded exactly like a live one, with the same events, timings, usage
  source and failure reasons, so the comparison compares like with like; nothing re-implements them.
- Over a real loopback socket, not ASGI: the gateway's timings include what a client costs it,
  as in production, and a cancelled request is a real client disconnect, which the gateway records
  as it records any (`call.failed`, `client_disconnected`).
- In-process, not `ledger serve` as a child: no port to race for (the socket is bound to port 0
  and kept), no log file, one Ctrl-C to handle, and the gateway's own counters (completion tokens)
  feed the progress bar. The cost: the client and the gateway share one event loop; replay's
  client does little per call (one POST, the response read and dropped).

What `serve` does that this does not: signal handling (the replay owns Ctrl-C), background
projection followers and the read API (the replay catches the projections up at its end), and
signed checkpoints (the long-running `ledger serve` of the installation keeps those).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec

from usage_ledger.gateway.app import create_app
from usage_ledger.gateway.limits import ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.rawclient import RawUpstream
from usage_ledger.gateway.sampler import ServerSampler
from usage_ledger.gateway.serve import bind_socket
from usage_ledger.gateway.server import HttpServer
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.settings import StorageSettings
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.waiting import wait_up_to
from usage_ledger.ledger.writer import EventWriter

__all__ = ("RecordingGateway", "recording_gateway")

SHUTDOWN_GRACE_S = 5.0
"""Calls still running when the replay stops (Ctrl-C) were cancelled by their client already;
this bounds how long their connections may take to close."""


class RecordingGateway(msgspec.Struct, frozen=True):
    url: str
    metrics: Metrics


@contextlib.asynccontextmanager
async def recording_gateway(
    settings: GatewaySettings, storage: StorageSettings, database: Database
) -> AsyncIterator[RecordingGateway]:
    """A gateway in front of `settings.upstream`, writing into `database`, listening on 127.0.0.1."""
    settings = msgspec.structs.replace(settings, host="127.0.0.1", port=0)
    writer = EventWriter(database, Spool(storage.spool_dir), batch_max_events=storage.batch_max_events)
    async with writer:  # on exit the writer drains its queue: every call that finished is committed
        client = RawUpstream(settings)
        sampler = ServerSampler(settings, writer)  # a sample on each side of the new run, as `ledger serve`
        sampling = asyncio.create_task(sampler.run(), name="replay-server-sampler")
        try:
            # No fingerprint key: nothing secret is sent, so nothing is fingerprinted.
            app = create_app(settings, database=database, writer=writer, upstream=client)
            app.proxy.recorder.watcher = sampler
            await wait_up_to(sampler.ready.wait(), settings.server_sample_timeout_s + 1)
            sock = bind_socket(settings.host, 0)
            server = HttpServer(app.handle, limits=ServerLimits.from_settings(settings), metrics=app.metrics)
            await server.start(sock)
            try:
                yield RecordingGateway(f"http://127.0.0.1:{sock.getsockname()[1]}", app.metrics)
            finally:
                await server.shutdown(SHUTDOWN_GRACE_S)
                await sampler.last_sample()  # the closing sample of the new run's window
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampling
            await client.aclose()
