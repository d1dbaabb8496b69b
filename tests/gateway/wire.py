"""Reading raw HTTP/1.1 responses off a socket, for tests that speak the wire protocol themselves."""

from __future__ import annotations

import asyncio


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lower-cased names), body (by length, chunked, or to the end)."""
    status_line = await reader.readuntil(b"\r\n")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, value = line.decode("latin-1").split(":", 1)
        headers[name.strip().lower()] = value.strip()
    if status == 100:
        return status, headers, b""
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return status, headers, body
            body += data[:-2]
    return status, headers, await reader.read()
