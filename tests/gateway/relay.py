"""A database outage on demand: `TcpCut`, a relay to PostgreSQL the test cuts and restores, and `ledger serve`
reaching its database through one (`relayed_gateway`, the fixture of that name in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.gateway import processes
from tests.gateway.processes import Process

__all__ = ("RelayedGateway", "TcpCut", "relayed_gateway")


class TcpCut:
    """A TCP relay to PostgreSQL that the test can cut (drop every connection, refuse new ones) and restore."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.port = processes.free_port()
        self.writers: set[asyncio.StreamWriter] = set()
        self.hold_server_close = False
        """While set, a connection the server ends keeps the client's side open: the client reads the server's
        goodbye without the EOF behind it (a race a real network loses now and then) until it goes itself."""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        self.writers.clear()
        await self.server.wait_closed()
        self.server = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}

        client_gone = asyncio.Event()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, from_server: bool) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            if not from_server:
                client_gone.set()
            elif self.hold_server_close:
                await client_gone.wait()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer, from_server=False), pipe(up_reader, writer, from_server=True))
        self.writers -= {writer, up_writer}


@dataclass
class RelayedGateway:
    gateway: Process
    """Started; `.url` is its base URL."""
    relay: TcpCut
    """Between the gateway and PostgreSQL, running: `cut()` is the outage, `start()` its end."""


@contextlib.asynccontextmanager
async def relayed_gateway(emulator_url: str, pg_url: str, tmp_path: Path) -> AsyncIterator[RelayedGateway]:
    """`ledger serve` in front of `emulator_url`, its PostgreSQL ledger (`pg_url`, migrated here) behind a
    `TcpCut`; on exit the gateway stops, then the relay."""
    processes.upgrade(pg_url)
    parsed = make_url(pg_url)
    relay = TcpCut(parsed.host or "127.0.0.1", parsed.port or 5432)
    await relay.start()
    via_relay = parsed.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    gateway = processes.gateway(tmp_path, emulator_url, via_relay)
    try:
        await asyncio.to_thread(gateway.start)  # the relay runs on this loop: do not block it
        yield RelayedGateway(gateway, relay)
    finally:
        await asyncio.to_thread(gateway.stop)
        if relay.server is not None:
            await relay.cut()
