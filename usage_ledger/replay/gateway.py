"""The gateway a replay records through: the real one, in this process, on a loopback port.

Why in-process and over a socket, rather than a subprocess or a second recording path:
- Same code as `ledger serve`: `gateway.serve.gateway_app` (the `EventWriter` with its spool, the
  upstream client `Upstream`, the `ServerSampler`, `create_app` with the proxy, usage injection
  and recorder) served by `gateway.serve.listening` (the gateway's own server). A replayed call is
  recorded exactly like a live one, with the same events, timings, usage source and failure reasons,
  so the comparison compares like with like; nothing re-implements them.
- Over a real loopback socket, not in memory: the gateway's timings include what a client costs it,
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

import contextlib
from collections.abc import AsyncIterator

import msgspec

from usage_ledger.gateway import GatewaySettings, Metrics, bind_socket, gateway_app, listening
from usage_ledger.ledger import Database, StorageSettings

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
    # No fingerprint key: nothing secret is sent, so nothing is fingerprinted. On exit the closing
    # sample of the new run's window is taken and the writer drains: every call that finished is committed.
    async with gateway_app(settings, storage, database) as app:
        sock = bind_socket(settings.host, 0)
        async with listening(app, settings, sock, grace_s=SHUTDOWN_GRACE_S):
            yield RecordingGateway(f"http://127.0.0.1:{sock.getsockname()[1]}", app.metrics)
