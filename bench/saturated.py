"""The gateway with a CPU-saturated upstream: streamed chunks/s through `ledger serve` ÷ direct, same run.

    .venv/bin/python bench/saturated.py [--rounds 5] [--streams 8] [--chunks 2000]

The upstream (this file with `--serve PORT`, its own process, uvloop) answers every request with an
SSE stream of `--chunks` OpenAI-shaped content chunks and `data: [DONE]`, written one chunk per
write as fast as it can (it yields to its loop between chunks, like a server that generates them).
Nothing waits on a model, so whatever is slowest — the upstream, the client, or the gateway in
between — sets the rate; the gateway's ratio to direct says what it costs when it is in the way.
`ledger serve` (next to this interpreter: run with the venv whose gateway you measure) records
every stream (SQLite, strict durability). Rounds alternate direct and gateway; medians are printed
as JSON, with the gateway's CPU per relayed chunk. Never used as a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import cast

from gateway import cpu_seconds, machine, medians, new_ledger, start_gateway, wait_listening  # bench/ is on sys.path

from usage_ledger.processes import free_port

CHUNK = (
    b'data: {"id":"chatcmpl-flood","object":"chat.completion.chunk","created":1,"model":"flood",'
    b'"choices":[{"index":0,"delta":{"content":"tok"},"logprobs":null,"finish_reason":null}]}\n\n'
)
MARK = b"data: {"


class _Flood(asyncio.Protocol):
    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.resumed: asyncio.Event = asyncio.Event()
        self.resumed.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def pause_writing(self) -> None:
        self.resumed.clear()

    def resume_writing(self) -> None:
        self.resumed.set()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        asyncio.get_running_loop().create_task(self.stream())

    async def stream(self) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        framed = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)
        for _ in range(self.chunks):
            if transport.is_closing():
                return
            transport.write(framed)
            await asyncio.sleep(0)  # one chunk per loop turn, as a generating server sends them
            if not self.resumed.is_set():
                await self.resumed.wait()
        done = b"data: [DONE]\n\n"
        transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


async def _serve(port: int, chunks: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Flood(chunks), "127.0.0.1", port)
    await server.serve_forever()


async def _streams(port: int, streams: int) -> tuple[float, int]:
    """`streams` concurrent streams over raw sockets; chunks per second over all of them."""
    body = b'{"model":"flood","messages":[{"role":"user","content":"x"}],"stream":true}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def one() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        count, tail = 0, b""
        while True:
            data = await reader.read(1 << 20)
            if not data:
                break
            joined = tail + data
            count += joined.count(MARK)
            if b"data: [DONE]" in joined:
                break
            tail = joined[-(len(MARK) - 1) :]
        writer.close()
        return count

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(counts) / (time.perf_counter() - t0), sum(counts)


async def main(args: argparse.Namespace) -> dict[str, object]:
    tmp, db = new_ledger("bench-sat-")
    flood_port, gw_port = free_port(), free_port()
    flood = subprocess.Popen([sys.executable, __file__, "--serve", str(flood_port), "--chunks", str(args.chunks)])
    upstream = f"http://127.0.0.1:{flood_port}"
    gw = start_gateway(upstream, gw_port, db, tmp, "--no-projections", env={"LEDGER_SERVER_SAMPLE_S": "0"})
    rounds: list[dict[str, float]] = []
    try:
        wait_listening(flood_port, flood)
        wait_listening(gw_port, gw)
        await _streams(gw_port, 2)  # warm up both
        await _streams(flood_port, 2)
        for _ in range(args.rounds):
            direct, _ = await _streams(flood_port, args.streams)
            cpu0 = cpu_seconds(gw.pid)
            via, chunks = await _streams(gw_port, args.streams)
            cpu = cpu_seconds(gw.pid) - cpu0
            rounds.append(
                {
                    "direct_chunks_per_s": direct,
                    "gateway_chunks_per_s": via,
                    "chunks_ratio": via / direct,
                    "gateway_cpu_us_per_chunk": cpu / chunks * 1e6,
                }
            )
    finally:
        for proc in (gw, flood):
            proc.terminate()
            proc.wait(timeout=60)
    summary = medians(rounds)
    summary.update(rounds=args.rounds, streams=args.streams, chunks=args.chunks, **machine())
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve:
        import uvloop

        uvloop.run(_serve(arguments.serve, arguments.chunks))
    else:
        print(json.dumps(asyncio.run(main(arguments)), indent=2))
