"""Gateway overhead: the same workload direct to the emulator and through `ledger serve`, in one run.

    .venv/bin/python bench/gateway.py [--rounds 3] [--calls 400] [--streams 14] [--tokens 400] [--rss-calls 5000]
    .venv/bin/python bench/gateway.py --upstream http://127.0.0.1:8200 --model tiny ...   # a running (real) vLLM

Starts `ledger emulate` (unless `--upstream` names a running server) and `ledger serve` (SQLite ledger in a temp dir, strict durability,
recording on) as processes, then measures, alternating direct and gateway in each round:
  - non-stream latency (max_tokens=1, sequential; each turn one call to each target, in a shuffled
    order): median and p99; added = gateway - direct. The p99 of a round of 100 calls is about its
    largest call: `added_latency_p99_ms_all_rounds` takes it over every round's calls together
  - TTFT of a stream (sequential, turns as above): median; added = gateway - direct
  - streamed chunks/s with N concurrent streams of a fixed length; ratio gateway / direct
  - gateway CPU (utime+stime from /proc) per relayed chunk during the stream phase; per round (median) and
    summed over all rounds (`_all_rounds`: /proc counts 10 ms ticks, one round is only ~10-15 of them)
  - gateway RSS before and after --rss-calls calls, and after each tenth of them
  - the disk's fdatasync latency before and after the rounds, and the 1-minute load average
  - the same latency, TTFT, chunks/s and CPU figures through `bench/relay.py`, a bare TCP relay in
    its own process (`relay_*`): the floor that one more loopback hop through a Python process
    costs on this machine, measured in the same rounds; `gateway_cpu_us_per_chunk_above_relay` is
    what the gateway adds on top of it
Prints a JSON summary (medians over rounds). Never used as a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from usage_ledger.ledger.heap import freeze_startup_heap
from usage_ledger.processes import free_port

LEDGER = str(Path(sys.executable).parent / "ledger")
RELAY = str(Path(__file__).with_name("relay.py"))
MODEL = "emulator-moe"
CHUNK_MARK = b"data: {"  # the start of every streamed chunk but `data: [DONE]`
TICK = os.sysconf("SC_CLK_TCK")


def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(400):
        if proc.poll() is not None:
            raise SystemExit(f"process exited: {proc.args}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"not healthy: {url}")


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(400):
        if proc.poll() is not None:
            raise SystemExit(f"process exited: {proc.args}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"not listening: {port}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def new_ledger(prefix: str) -> tuple[Path, str]:
    """A temp directory with a migrated SQLite ledger in it: (directory, database URL)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    db = f"sqlite:///{tmp / 'ledger.db'}"
    subprocess.run([LEDGER, "db", "upgrade", "--db", db], check=True, capture_output=True)
    return tmp, db


def start_gateway(
    upstream: str, port: int, db: str, tmp: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`ledger serve` in front of `upstream`, its spool and warnings (`gateway.log`) in `tmp`."""
    return subprocess.Popen(
        [
            *(LEDGER, "serve", "--upstream", upstream, "--port", str(port), "--db", db),
            *("--spool-dir", str(tmp / "spool"), *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "gateway.log", "wb"),  # closed with the process (Popen keeps it)
        env={**os.environ, "LEDGER_LOG_LEVEL": "warning", **(env or {})},
    )


def medians(rounds: list[dict[str, float]]) -> dict[str, object]:
    """Each figure's median over the rounds."""
    return {key: round(statistics.median(r[key] for r in rounds), 4) for key in rounds[0]}


def machine() -> dict[str, object]:
    """What else the box was doing: the 1-minute load average and the number of CPUs."""
    return {"loadavg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def chat(stream: bool, tokens: int, i: int) -> dict[str, object]:
    body: dict[str, object] = {
        "model": MODEL,  # --model sets it
        "messages": [{"role": "user", "content": f"benchmark call {i}"}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "stream": stream,
    }
    return body


Target = tuple[httpx.AsyncClient, str]


def in_shuffled_turns(out: list[list[float]], targets: Sequence[Target], turn: int) -> list[tuple[list[float], Target]]:
    """Each target once per turn, in a different order each turn: a call's latency can depend on what
    ran just before it (the emulator's step timing, the gateway's commit and projection work), and
    a fixed order would let that favour one path."""
    pairs = list(zip(out, targets, strict=True))
    random.Random(turn).shuffle(pairs)
    return pairs


async def latency(targets: Sequence[Target], calls: int) -> list[list[float]]:
    """Sequential non-stream calls, one to each target per turn (drift on the shared box hits all alike)."""
    out: list[list[float]] = [[] for _ in targets]
    for i in range(calls):
        for times, (client, base) in in_shuffled_turns(out, targets, i):
            t0 = time.perf_counter()
            resp = await client.post(base + "/v1/chat/completions", json=chat(False, 1, i))
            resp.read()
            times.append(time.perf_counter() - t0)
    return out


async def ttft(targets: Sequence[Target], calls: int) -> list[list[float]]:
    """Time to the first content token of sequential streams, one to each target per turn."""
    out: list[list[float]] = [[] for _ in targets]
    for i in range(calls):
        for times, (client, base) in in_shuffled_turns(out, targets, i):
            t0 = time.perf_counter()
            first = None
            async with client.stream("POST", base + "/v1/chat/completions", json=chat(True, 4, i)) as resp:
                async for line in resp.aiter_lines():
                    if first is None and '"content":"' in line and '"content":""' not in line:
                        first = time.perf_counter() - t0
            times.append(first or 0.0)
    return out


async def throughput(client: httpx.AsyncClient, base: str, streams: int, tokens: int) -> tuple[float, int]:
    counts = [0] * streams

    async def one(i: int) -> None:
        # Chunks counted in the raw bytes: decoding and splitting every line made this client the
        # heaviest process on the box, competing for the 2 cores with the servers it measures.
        tail = b""
        async with client.stream("POST", base + "/v1/chat/completions", json=chat(True, tokens, i)) as resp:
            async for data in resp.aiter_raw():
                joined = tail + data
                counts[i] += joined.count(CHUNK_MARK)
                tail = joined[-(len(CHUNK_MARK) - 1) :]  # a mark cut between reads counts once it is whole

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(streams)))
    elapsed = time.perf_counter() - t0
    return sum(counts) / elapsed, sum(counts)


def fsync_ms(directory: Path, count: int = 100) -> tuple[float, float]:
    """The disk's fdatasync latency right now (p50, p99 in ms): strict durability waits for one per call."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    times = []
    try:
        for _ in range(count):
            os.write(fd, b"x" * 4096)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1000, pct(times, 0.99) * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict[str, object]:
    tmp, db = new_ledger("bench-gw-")
    emu_port, gw_port = free_port(), free_port()
    emu: subprocess.Popen[bytes] | None = None
    if args.upstream:
        upstream = args.upstream.rstrip("/")
        emu_port = int(upstream.rsplit(":", 1)[1])
    else:
        upstream = f"http://127.0.0.1:{emu_port}"
        emu = subprocess.Popen(
            [LEDGER, "emulate", "--port", str(emu_port), "--speed", str(args.speed), "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    no_projections = ["--no-projections"] if args.no_projections else []
    gw = start_gateway(upstream, gw_port, db, tmp, "--durability", args.durability, *no_projections)
    relay_port = free_port()
    relay = subprocess.Popen([sys.executable, RELAY, str(relay_port), str(emu_port)])
    direct, via = upstream, f"http://127.0.0.1:{gw_port}"
    bare = f"http://127.0.0.1:{relay_port}"
    try:
        wait_healthy(direct + "/health", emu or gw)
        wait_healthy(via + "/_ledger/health", gw)
        wait_listening(relay_port, relay)
        # Idle connections are dropped after 2 s, well before any server closes them (uvicorn's 5 s
        # keep-alive timeout, the gateway's own, the relay's once the emulator closed): a request
        # sent on a connection whose close was on its way failed with ReadError. One client per
        # target and phase: httpcore polls every idle connection of a pool (a syscall each) whenever
        # a request starts or ends, and a sequential call through a pool still holding the 28
        # connections of both stream phases took ~1.7 ms longer than through a pool of one (the
        # target with a pool of its own looked faster than direct).
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0)
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(httpx.AsyncClient(timeout=120, limits=limits)) for _ in range(6)]
            sequential, streaming = clients[:3], clients[3:]
            targets = list(zip(sequential, (direct, via, bare), strict=True))
            direct_client, via_client, relay_client = streaming
            await latency(targets, 50)
            # this client's own start-up objects out of GC scans: a full collection of them stalled
            # whichever call was being timed for ~40 ms (the servers do the same when they start)
            freeze_startup_heap()
            fsync_before = fsync_ms(tmp)
            rounds = []
            cpu_total, chunks_total = 0.0, 0
            relay_cpu_total, relay_chunks_total = 0.0, 0
            pooled_direct: list[float] = []  # every round's latencies: a round's p99 is its largest call or two
            pooled_gateway: list[float] = []
            for _ in range(args.rounds):
                r: dict[str, float] = {}
                d_lat, g_lat, r_lat = await latency(targets, args.calls)
                pooled_direct += d_lat
                pooled_gateway += g_lat
                r["added_latency_median_ms"] = (statistics.median(g_lat) - statistics.median(d_lat)) * 1000
                r["added_latency_p99_ms"] = (pct(g_lat, 0.99) - pct(d_lat, 0.99)) * 1000
                r["direct_latency_median_ms"] = statistics.median(d_lat) * 1000
                r["relay_added_latency_median_ms"] = (statistics.median(r_lat) - statistics.median(d_lat)) * 1000
                r["relay_added_latency_p99_ms"] = (pct(r_lat, 0.99) - pct(d_lat, 0.99)) * 1000
                d_tt, g_tt, r_tt = await ttft(targets, args.calls // 4)
                r["added_ttft_median_ms"] = (statistics.median(g_tt) - statistics.median(d_tt)) * 1000
                r["relay_added_ttft_median_ms"] = (statistics.median(r_tt) - statistics.median(d_tt)) * 1000
                d_cps, _ = await throughput(direct_client, direct, args.streams, args.tokens)
                cpu0 = cpu_seconds(gw.pid)
                g_cps, chunks = await throughput(via_client, via, args.streams, args.tokens)
                cpu1 = cpu_seconds(gw.pid)
                r["direct_chunks_per_s"] = d_cps
                r["gateway_chunks_per_s"] = g_cps
                r["chunks_ratio"] = g_cps / d_cps
                r["gateway_cpu_us_per_chunk"] = (cpu1 - cpu0) / chunks * 1e6
                relay_cpu0 = cpu_seconds(relay.pid)
                r_cps, relay_chunks = await throughput(relay_client, bare, args.streams, args.tokens)
                relay_cpu = cpu_seconds(relay.pid) - relay_cpu0
                r["relay_chunks_ratio"] = r_cps / d_cps
                r["relay_cpu_us_per_chunk"] = relay_cpu / relay_chunks * 1e6
                rounds.append(r)
                cpu_total += cpu1 - cpu0
                chunks_total += chunks
                relay_cpu_total += relay_cpu
                relay_chunks_total += relay_chunks
            fsync_after = fsync_ms(tmp)
            rss_before = rss_mib(gw.pid)
            sem = asyncio.Semaphore(14)

            async def one(i: int) -> None:
                async with sem:
                    (await via_client.post(via + "/v1/chat/completions", json=chat(i % 2 == 0, 2, i))).read()

            # RSS after each tenth of the calls: a leak grows with every slice, a cache levels off
            rss_samples = []
            slice_size = max(1, args.rss_calls // 10)
            for start in range(0, args.rss_calls, slice_size):
                await asyncio.gather(*(one(i) for i in range(start, min(start + slice_size, args.rss_calls))))
                rss_samples.append(round(rss_mib(gw.pid), 1))
            rss_after = rss_samples[-1]
    finally:
        for proc in (relay, gw, emu):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=60)
    summary = medians(rounds)
    summary.update(
        added_latency_p99_ms_all_rounds=round((pct(pooled_gateway, 0.99) - pct(pooled_direct, 0.99)) * 1000, 4),
        latency_max_ms_direct_gateway=[round(max(pooled_direct) * 1000, 3), round(max(pooled_gateway) * 1000, 3)],
        gateway_cpu_us_per_chunk_all_rounds=round(cpu_total / chunks_total * 1e6, 2),
        relay_cpu_us_per_chunk_all_rounds=round(relay_cpu_total / relay_chunks_total * 1e6, 2),
        gateway_cpu_us_per_chunk_above_relay=round(
            (cpu_total / chunks_total - relay_cpu_total / relay_chunks_total) * 1e6, 2
        ),
        rounds=args.rounds,
        calls=args.calls,
        streams=args.streams,
        tokens=args.tokens,
        speed=args.speed,
        upstream=args.upstream or "emulator",
        model=MODEL,
        durability=args.durability,
        rss_calls=args.rss_calls,
        rss_mib_before=round(rss_before, 1),
        rss_mib_after=round(rss_after, 1),
        rss_mib_per_tenth=rss_samples,
        fsync_ms_p50_p99_before=[round(v, 3) for v in fsync_before],
        fsync_ms_p50_p99_after=[round(v, 3) for v in fsync_after],
        **machine(),
    )
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--streams", type=int, default=14)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--durability", choices=("strict", "async"), default="strict")
    parser.add_argument(
        "--no-projections", action="store_true", help="serve without the in-process projection follower"
    )
    parser.add_argument("--rss-calls", type=int, default=5000)
    parser.add_argument("--upstream", default=None, help="a running OpenAI-compatible server (e.g. real vLLM)")
    parser.add_argument("--model", default=MODEL, help="the model name the upstream serves")
    arguments = parser.parse_args()
    MODEL = arguments.model
    print(json.dumps(asyncio.run(main(arguments)), indent=2))
