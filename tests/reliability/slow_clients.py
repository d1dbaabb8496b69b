"""Raw-socket clients that are slow or endless on purpose: partial heads, trickled heads, stalled bodies,
bodies trickled again each time the gateway ends them, header lines that never end.

Each returns what the gateway did with its connection: the status of the answer it read (`"408"`),
`"closed"` (no answer, the connection ended), `"reset"`, or `"open"` (nothing happened in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections import Counter

HEAD_START = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def allow_open_files(count: int) -> None:
    """Raise this process's soft fd limit so the test itself can hold `count` connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count, hard), hard))


def status_of(data: bytes) -> str:
    if not data:
        return "closed"
    parts = data.split(b" ", 2)
    return parts[1].decode() if data.startswith(b"HTTP/1.") and len(parts) > 1 else "garbage"


async def answer(conn: Connection, timeout_s: float) -> str:
    """Wait for the gateway to answer or close the connection."""
    reader, writer = conn
    try:
        async with asyncio.timeout(timeout_s):
            data = await reader.read(65536)
    except TimeoutError:
        return "open"
    except ConnectionError:
        return "reset"
    finally:
        writer.close()
    return status_of(data)


async def answer_in_full(conn: Connection, timeout_s: float) -> bytes:
    """Everything the gateway sends until it closes the connection."""
    reader, writer = conn
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read(-1)
    finally:
        writer.close()


async def partial_head(port: int) -> Connection:
    """A connection that sent part of a request head and then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD_START)
    await writer.drain()
    return reader, writer


async def trickled_head(port: int, interval_s: float, give_up_s: float) -> str:
    """Send a long head one byte per `interval_s` until the gateway answers (or `give_up_s` passes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = HEAD_START + b"x-padding: " + b"p" * 4000 + b"\r\n\r\n"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_s
    try:
        for byte in head:
            if loop.time() > deadline:
                return "open"
            with contextlib.suppress(ConnectionError):
                writer.write(bytes([byte]))
            try:
                data = await asyncio.wait_for(reader.read(65536), interval_s)
            except TimeoutError:
                continue
            except ConnectionError:
                return "reset"
            return status_of(data)
        return "sent whole"
    finally:
        writer.close()


async def stalled_body(port: int, declared: int, sent: int, *, piece: int = 1024 * 1024) -> Connection:
    """A request whose head says `declared` body bytes, of which `sent` are sent; then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD_START + b"content-length: %d\r\n\r\n" % declared)
    block = b"x" * piece
    left = sent
    with contextlib.suppress(ConnectionError):
        while left > 0:
            writer.write(block[: min(piece, left)])
            left -= piece
            await writer.drain()
    return reader, writer


async def trickled_body(port: int, interval_s: float, give_up_s: float, declared: int = 1000) -> str:
    """Declare `declared` body bytes and send one every `interval_s` until the gateway answers (or `give_up_s`)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_s
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(HEAD_START + b"content-length: %d\r\n\r\n" % declared)
        for _ in range(declared):
            if loop.time() > deadline:
                return "open"
            try:
                data = await asyncio.wait_for(reader.read(65536), interval_s)
            except TimeoutError:
                with contextlib.suppress(ConnectionError):
                    writer.write(b"x")
                continue
            except ConnectionError:
                return "reset"
            return status_of(data)
        return "sent whole"
    finally:
        writer.close()


async def reopening_trickler(port: int, interval_s: float, until: float, declared: int = 100_000) -> Counter[str]:
    """`trickled_body` again and again, a new connection as soon as the gateway ended the last one, until loop time
    `until`; how each connection ended."""
    loop = asyncio.get_running_loop()
    outcomes: Counter[str] = Counter()
    while (left := until - loop.time()) > 0:
        outcome = await trickled_body(port, interval_s, give_up_s=left, declared=declared)
        outcomes[outcome] += 1
        if outcome == "refused":
            await asyncio.sleep(0.01)  # the listen queue is full: not a hot loop on this shared box
    return outcomes


async def header_bomb(port: int, give_up_s: float, *, block: int = 64 * 1024) -> str:
    """A request head whose one header line never ends, sent as fast as the gateway reads it until the gateway
    answers or closes (or `give_up_s` passes: "open")."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_s
    answered = asyncio.ensure_future(reader.read(65536))
    filler = b"a" * block
    try:
        writer.write(HEAD_START + b"x-bomb: ")
        while not answered.done() and (left := deadline - loop.time()) > 0:
            try:
                writer.write(filler)
                await asyncio.wait_for(writer.drain(), left)
            except (ConnectionError, TimeoutError):
                break
        try:
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                data = await answered
        except TimeoutError:
            return "open"
        except ConnectionError:
            return "reset"
        return status_of(data)
    finally:
        answered.cancel()
        writer.close()
