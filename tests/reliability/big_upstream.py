"""A tiny upstream that answers every POST with one large JSON completion: `python -m tests.reliability.big_upstream PORT`.

The request says the size (`x-test-body-bytes`) and the framing (`x-test-framing: length | chunked`);
`big_body(size)` is the exact body, so a test can check what reached its client byte for byte and
the usage the gateway read from its end. `x-test-head-line-bytes: N` makes it hostile: the response head
begins with one header line of N bytes, sent a MiB at a time, before the rest. `GET /health` answers 200.
"""

from __future__ import annotations

import asyncio
import sys

PIECE = 1024 * 1024
_HEAD = b'{"id":"cmpl-big","object":"chat.completion","created":0,"model":"big","choices":[{"index":0,"message":'
_HEAD += b'{"role":"assistant","content":"'


def big_usage(size: int) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) a body of `size` bytes reports."""
    return 11, size // 4


def big_body(size: int) -> bytes:
    prompt, completion = big_usage(size)
    end = b'"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}' % (
        prompt,
        completion,
        prompt + completion,
    )
    pad = size - len(_HEAD) - len(end)
    assert pad >= 0, f"a body of {size} bytes is too small"
    return _HEAD + (b"abcdefghij" * (pad // 10 + 1))[:pad] + end


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            length = int(headers.get("content-length", "0"))
            if length:
                await reader.readexactly(length)
            if lines[0].startswith("GET /health"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")
                await writer.drain()
                continue
            body = big_body(int(headers.get("x-test-body-bytes", "1000")))
            chunked = headers.get("x-test-framing") == "chunked"
            framing = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % len(body)
            writer.write(b"HTTP/1.1 200 OK\r\n")
            await _header_line(writer, int(headers.get("x-test-head-line-bytes", "0")))
            writer.write(b"content-type: application/json\r\n%b\r\n\r\n" % framing)
            for start in range(0, len(body), PIECE):
                piece = body[start : start + PIECE]
                writer.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
                await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _header_line(writer: asyncio.StreamWriter, size: int) -> None:
    """One header line of `size` bytes (a name, then a value that goes on), a MiB per write."""
    if size <= 0:
        return
    writer.write(b"x-test-bomb: ")
    block = b"b" * PIECE
    for start in range(0, size, PIECE):
        writer.write(block[: min(PIECE, size - start)])
        await writer.drain()
    writer.write(b"\r\n")


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
