"""A bare TCP relay: the CPU floor any Python proxy on this machine stands on.

    .venv/bin/python bench/relay.py LISTEN_PORT UPSTREAM_PORT

Each accepted connection gets its own upstream connection and bytes are copied both ways as they
arrive (uvloop, no HTTP parsing, no recording, nothing else). `bench/gateway.py` runs it beside the
gateway: its CPU per relayed chunk is what one extra loopback hop through a Python process costs
by itself on this box, measured in the same run as the gateway. Its latency figures are the floor
too, now that every target has its own client (a shared pool had made it look faster than direct;
docs/BENCHMARKS.md, fourth session).
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports don't subclass it
        self.opening = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(lambda: _Upstream(self.transport), "127.0.0.1", self.upstream_port)
        self.upstream = upstream
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def main(listen_port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream_port), "127.0.0.1", listen_port)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
