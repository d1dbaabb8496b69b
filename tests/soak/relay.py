"""The soak's upstream: a relay in front of the emulator that misbehaves when a request asks it to.

The emulator's own `X-Emulator-Fault` covers resets mid-response, hangs before the headers and error
statuses. What it cannot do is answer with bytes that are not HTTP, or stall a response half-way;
a request carrying `x-soak-upstream: <fault>` (the gateway forwards it like any header) gets:

    garbage-head   random bytes instead of a response, then the connection closed
    garbage-body   a 200 whose Content-Length body is random bytes (passed on to the client as is)
    reset          the connection reset (RST) before any byte of the response
    hang-mid       the response relayed up to a few hundred bytes, then nothing until the gateway gives up
    endless-head   a status line, then one header line that never ends, until the gateway closes (or 64 MiB)

Every other request is relayed with `Connection: close` added, so each request has its own
connection and a fault never lands on a pooled one by chance. A request marked `x-soak-call: <marker>` (every
client call is) is noted in `reached` with the status the emulator answered (0 until its first byte, or when the
relay answered it with a fault): a call that reached the upstream, which must be in the ledger
(tests.soak.invariants).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections import Counter

__all__ = ("FAULTS", "UpstreamRelay")

FAULTS = ("garbage-head", "garbage-body", "reset", "hang-mid", "endless-head")
_ENDLESS_LIMIT = 64 * 1024 * 1024
_HANG_LIMIT_S = 120.0  # a gateway that never gives up on a hung upstream shows as a stuck call


def _garbage(rng: random.Random, size: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(size))


def _close_head(head: bytes) -> bytes:
    """The request head with any Connection header replaced by `Connection: close`."""
    lines = [line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"connection: close"]) + b"\r\n\r\n"


def _header(head: bytes, name: bytes) -> str:
    """The value of header `name` (given with its colon, lower case) in a request head, "" if absent."""
    return next(
        (line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n") if line.lower().startswith(name)), ""
    )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None = None) -> None:
    sent = 0
    while limit is None or sent < limit:
        data = await reader.read(65536 if limit is None else min(65536, limit - sent))
        if not data:
            return
        writer.write(data)
        await writer.drain()
        sent += len(data)


class UpstreamRelay:
    def __init__(self, target_port: int, seed: int) -> None:
        self.target_port = target_port
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.reached: dict[str, int] = {}
        self.port = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> UpstreamRelay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        for handler in list(self._handlers):  # e.g. a hang the gateway never gave up on
            handler.cancel()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            fault, marker = (_header(head, name) for name in (b"x-soak-upstream:", b"x-soak-call:"))
            if marker:
                self.reached[marker] = 0
            await self._answer(fault, head, reader, writer, marker)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, TimeoutError):
            pass
        except asyncio.CancelledError:
            pass  # closing: the connection goes with it
        finally:
            self._handlers.discard(handler)
            writer.close()

    async def _answer(
        self, fault: str, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, marker: str
    ) -> None:
        if fault:
            self.injected[fault] += 1
        if fault == "garbage-head":
            writer.write(_garbage(self.rng, self.rng.randint(1, 4096)))
            await writer.drain()
        elif fault == "garbage-body":
            body = _garbage(self.rng, self.rng.randint(0, 4096))
            kind = self.rng.choice([b"application/json", b"text/event-stream"])
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (kind, len(body), body)
            )
            await writer.drain()
        elif fault == "endless-head":
            writer.write(b"HTTP/1.1 200 OK\r\nx-soak-endless: ")
            block = b"e" * 65536
            for _ in range(_ENDLESS_LIMIT // len(block)):  # until the gateway closes: ConnectionError
                writer.write(block)
                await writer.drain()
        elif fault == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            await self._relay(head, reader, writer, self.rng.randint(200, 800) if fault == "hang-mid" else None, marker)

    async def _relay(
        self,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hang_after: int | None,
        marker: str,
    ) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        try:
            up_writer.write(_close_head(head))
            upload = asyncio.create_task(_pipe(reader, up_writer))
            try:
                if marker:  # the emulator's status: did it route the path to an inference API?
                    first = await up_reader.readuntil(b"\r\n")
                    status = first.split(b" ", 2)[1] if first.startswith(b"HTTP/1.") else b""
                    self.reached[marker] = int(status) if status.isdigit() else 0
                    writer.write(first)
                await _pipe(up_reader, writer, hang_after)
                if hang_after is not None:
                    # stall: forward nothing more and wait for the gateway to give up (it closes its side)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(upload), _HANG_LIMIT_S)
            finally:
                upload.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await upload
        finally:
            up_writer.close()
