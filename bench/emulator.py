"""Emulator benchmarks: streamed chunks/s of the real server process, and profile calibration.

    .venv/bin/python bench/emulator.py chunks [--streams 64] [--tokens 2000] [--seconds 8]
    .venv/bin/python bench/emulator.py calibrate [--calls 1700]

`chunks` starts `python -m usage_ledger.emulator --speed 1e6` (uvloop + httptools) as a subprocess and reads
SSE streams over raw asyncio sockets (so the client costs little CPU), counting `data: ` events.
`calibrate` runs the closed-loop timing model in pure emulated time (DESIGN §7 workload).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

REQUEST = (
    "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {n}\r\n\r\n{body}"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _stream(port: int, tokens: int, deadline: float, counts: list[int]) -> None:
    body = f'{{"prompt":"bench","max_tokens":{tokens},"min_tokens":{tokens},"stream":true}}'
    req = REQUEST.format(n=len(body), body=body).encode()
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(req)
        tail = b""
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            buf = tail + data
            counts[0] += buf.count(b"data: ") - tail.count(b"data: ")
            tail = buf[-16:]
            if b"data: [DONE]" in buf:
                break
            if time.monotonic() >= deadline:
                break
        writer.close()


async def _chunks(args: argparse.Namespace) -> None:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "usage_ledger.emulator",
        "--port",
        str(port),
        "--speed",
        "1e6",
        "--log-level",
        "warning",
    ]
    cmd += ["--max-num-seqs", str(args.streams), "--profile", args.profile]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        for _ in range(200):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        counts = [0]
        start = time.monotonic()
        deadline = start + args.seconds
        await asyncio.gather(*(_stream(port, args.tokens, deadline, counts) for _ in range(args.streams)))
        elapsed = time.monotonic() - start
        print(
            f"{counts[0]} SSE events in {elapsed:.2f} s over {args.streams} streams: {counts[0] / elapsed:,.0f} chunks/s"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _calibrate(args: argparse.Namespace) -> None:
    from usage_ledger.emulator import PROFILES, simulate

    for name, clients, target in (("moe", 14, 911.0), ("dense", 3, 118.0)):
        r = simulate(PROFILES[name], clients=clients, calls=args.calls)
        print(
            f"{name}: {clients} clients, {r.calls} calls: {r.throughput_tps:.1f} t/s (seed {target}), "
            f"wall {r.wall_s / 60:.1f} min, mean TTFT {r.mean_ttft_s:.2f} s"
        )


def main() -> None:
    # This file is named like the package: import the package, not this script.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("chunks")
    c.add_argument("--streams", type=int, default=64)
    c.add_argument("--tokens", type=int, default=2000)
    c.add_argument("--seconds", type=float, default=8.0)
    c.add_argument("--profile", default="moe")
    k = sub.add_parser("calibrate")
    k.add_argument("--calls", type=int, default=1700)
    args = parser.parse_args()
    if args.what == "chunks":
        try:
            import uvloop

            uvloop.run(_chunks(args))
        except ImportError:  # pragma: no cover
            asyncio.run(_chunks(args))
    else:
        _calibrate(args)


if __name__ == "__main__":
    main()
