"""Several gateways on one PostgreSQL: 1, 2, 4 `ledger serve` processes driven to saturation on loopback.

    .venv/bin/python bench/scale.py [--gateways 1,2,4] [--duration 20] [--clients 24] [--durability strict|async]
                                    [--follower] [--pg postgresql://postgres@127.0.0.1:5432/postgres]

Per N: a fresh database `scale_bench_N` (created through the admin connection `--pg`, upgraded with
`ledger db upgrade`, dropped afterwards unless `--keep-db`), N emulators and N gateways
(`--no-projections`, gateway i in front of emulator i: one emulator per gateway, so the upstream is
never one single-threaded process that all gateways queue behind, and the direct path has the same
N processes to spread over), optionally one `ledger projections run --follow` beside them.
A closed-loop load generator (httpx, `--clients` concurrent clients, half of them non-stream
max_tokens=1 calls, half streams of `--stream-tokens` tokens, client i on target i mod N) runs
`--duration` seconds against the emulators directly, then as long through the gateways; added
latency = gateway - direct (p50, p99) per kind, measured in the same run.

During the gateway phase a thread (`scale_probe.LockSampler`) samples `pg_stat_activity` joined with `pg_locks` every
`--sample-ms` for the database's client backends: the share of samples in which some backend
holds the append lock (the `ledger_head` row, taken by `SELECT … FOR UPDATE` and held to the end
of COMMIT, WAL flush included), the backend-seconds
spent waiting for it (samples x interval), and what the backends were waiting on otherwise
(state:wait_event_type:wait_event, for the lock's holder and for the others; `active:CPU` = running,
`idle in transaction` = waiting for the gateway's next statement). No instrumentation in the gateway.
CPU seconds (utime+stime from /proc) of every gateway, emulator, the follower, this process and
the PostgreSQL processes, and the machine's busy share (/proc/stat), over the gateway phase.

After the load: the follower catches up (seconds to reach the head), the gateways stop (SIGTERM,
writer drained), `ledger verify --format json` must report one unbroken chain, the events are
counted by type against what the load generator saw recorded (HTTP 200, body read to the end),
and each table's and index's size is read (pg_relation_size / pg_indexes_size /
pg_total_relation_size) with bytes per call. Prints a JSON summary. Never used as a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import httpx
import msgspec
from gateway import LEDGER, chat, cpu_seconds, pct, wait_healthy
from scale_probe import LockSampler, machine_busy, postgres_cpu

from usage_ledger.processes import free_port

_VOCABULARY = tuple(
    "the of and to in is that for on with as by at from this be are was or an it which not have has but were "
    "ticker revenue margin guidance quarter growth shares price earnings outlook risk segment demand supply cost "
    "cash flow debt capital market analyst estimate forecast year report filing company sector rate inflation".split()
)
SIZES_SQL = """
SELECT c.relname, c.relkind::text AS relkind, pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') ORDER BY c.relname
"""


class Procs:
    """The child processes of one N, stopped in reverse order."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # closed with the process (Popen keeps it)
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=env)
        self.children.append((name, proc))
        return proc

    def stop(self, names: tuple[str, ...] = ()) -> None:
        for name, proc in reversed(self.children):
            if (not names or name.startswith(names)) and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)


class Phase(msgspec.Struct):
    """What the load generator saw in one phase: latencies of the calls answered 200, by kind."""

    elapsed_s: float
    ok: int
    status: dict[int, int]
    errors: dict[str, int]
    lat: dict[str, list[float]]


class LedgerCounts(msgspec.Struct):
    types: dict[str, int]
    events: int
    last_position: int
    blobs: int
    sizes: list[dict[str, object]]
    checkpoints: dict[str, int]
    payload_bytes_by_type: dict[str, float]
    blob_bytes_mean: dict[str, float]


def prompt_text(i: int, size: int) -> str:
    """`size` bytes of word salad, different per call: compresses about like prose (a repeated
    filler would compress a thousandfold and make the stored bodies look free)."""
    rng = random.Random(i)
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_VOCABULARY)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


async def drive(urls: list[str], clients: int, seconds: float, stream_tokens: int, prompt_bytes: int = 0) -> Phase:
    """Closed loop: `clients` tasks, each sending its next call as soon as the last one ended."""
    lat: dict[str, list[float]] = {"non_stream": [], "stream": []}
    status: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2.0)
    deadline = time.perf_counter() + seconds

    async def client(k: int, http: httpx.AsyncClient) -> None:
        base, stream, i = urls[k % len(urls)], k % 2 == 1, 0
        kind = "stream" if stream else "non_stream"
        while time.perf_counter() < deadline:
            i += 1
            t0 = time.perf_counter()
            try:
                body = chat(stream, stream_tokens if stream else 1, k * 1_000_000 + i)
                if prompt_bytes:
                    body["messages"] = [{"role": "user", "content": prompt_text(k * 1_000_000 + i, prompt_bytes)}]
                async with http.stream("POST", base + "/v1/chat/completions", json=body) as resp:
                    async for _ in resp.aiter_raw():
                        pass
                status[resp.status_code] += 1
                if resp.status_code == 200:
                    lat[kind].append(time.perf_counter() - t0)
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await asyncio.gather(*(client(k, http) for k in range(clients)))
    elapsed = time.perf_counter() - t0
    ok = len(lat["non_stream"]) + len(lat["stream"])
    return Phase(elapsed_s=elapsed, ok=ok, status=dict(status), errors=dict(errors), lat=lat)


def added(direct: Phase, via: Phase) -> dict[str, float]:
    out = {}
    for kind in ("non_stream", "stream"):
        d, g = direct.lat[kind], via.lat[kind]
        out[f"{kind}_direct_p50_ms"] = round(statistics.median(d) * 1000, 2)
        out[f"{kind}_gateway_p50_ms"] = round(statistics.median(g) * 1000, 2)
        out[f"{kind}_added_p50_ms"] = round((statistics.median(g) - statistics.median(d)) * 1000, 2)
        out[f"{kind}_added_p99_ms"] = round((pct(g, 0.99) - pct(d, 0.99)) * 1000, 2)
    return out


async def ledger_counts(dsn: str) -> LedgerCounts:
    conn = await asyncpg.connect(dsn)
    try:
        types = {r["type"]: r["n"] for r in await conn.fetch("SELECT type, count(*) n FROM ledger_events GROUP BY 1")}
        head = await conn.fetchrow("SELECT count(*) n, coalesce(max(position), 0) last FROM ledger_events")
        blobs = await conn.fetchval("SELECT count(*) FROM ledger_blobs")
        payloads = {
            r["type"]: round(float(r["avg"]), 1)
            for r in await conn.fetch("SELECT type, avg(octet_length(payload)) avg FROM ledger_events GROUP BY 1")
        }
        blob_bytes = dict(
            await conn.fetchrow(
                "SELECT coalesce(avg(size), 0) size, coalesce(avg(stored_size), 0) stored FROM ledger_blobs"
            )
        )
        sizes = [dict(r) for r in await conn.fetch(SIZES_SQL)]
        checkpoints = {
            f"{r['projection']}@{r['version']}": r["position"]
            for r in await conn.fetch("SELECT projection, version, position FROM ledger_checkpoints")
        }
    finally:
        await conn.close()
    return LedgerCounts(
        types=types,
        events=head["n"],
        last_position=head["last"],
        blobs=blobs,
        sizes=sizes,
        checkpoints=checkpoints,
        payload_bytes_by_type=payloads,
        blob_bytes_mean={k: round(float(v), 1) for k, v in blob_bytes.items()},
    )


async def head_position(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT coalesce(max(position), 0) FROM ledger_events"))
    finally:
        await conn.close()


async def follower_catch_up(dsn: str, limit_s: float = 120.0) -> float | None:
    """Seconds until every checkpoint reaches the head after the load stopped (None: not in time)."""
    conn = await asyncpg.connect(dsn)
    try:
        head = await conn.fetchval("SELECT coalesce(max(position), 0) FROM ledger_events")
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit_s:
            low = await conn.fetchval("SELECT min(position) FROM ledger_checkpoints")
            if low is not None and low >= head:
                return round(time.perf_counter() - t0, 2)
            await asyncio.sleep(0.1)
        return None
    finally:
        await conn.close()


async def run_n(args: argparse.Namespace, n: int) -> dict[str, object]:
    name = f"scale_bench_{n}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    await admin.execute(f"CREATE DATABASE {name}")
    await admin.close()
    dsn = args.pg.rsplit("/", 1)[0] + f"/{name}"
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
    upgrade = subprocess.run([LEDGER, "db", "upgrade", "--db", dsn], capture_output=True, text=True)
    if upgrade.returncode != 0:
        raise SystemExit(f"ledger db upgrade --db {dsn} failed: {upgrade.stderr[-2000:]}")
    # the server sampler's `server.sampled` events would add to the count the chain is checked against
    env = {**os.environ, "LEDGER_LOG_LEVEL": "warning", "LEDGER_SERVER_SAMPLE_S": "0"}
    procs = Procs(tmp)
    emulators, gateways = [], []
    emu_urls, gw_urls = [], []
    follower = None
    try:
        for i in range(n):
            port = free_port()
            emulators.append(
                procs.start(
                    f"emulator{i}",
                    [LEDGER, "emulate", "--port", str(port), "--speed", str(args.speed), "--log-level", "warning"],
                    env,
                )
            )
            emu_urls.append(f"http://127.0.0.1:{port}")
        for i in range(n):
            port = free_port()
            gateways.append(
                procs.start(
                    f"gateway{i}",
                    [
                        LEDGER,
                        "serve",
                        "--upstream",
                        emu_urls[i],
                        "--port",
                        str(port),
                        "--db",
                        dsn,
                        "--spool-dir",
                        str(tmp / f"spool{i}"),
                        "--durability",
                        args.durability,
                        "--no-projections",
                    ],
                    env,
                )
            )
            gw_urls.append(f"http://127.0.0.1:{port}")
        if args.follower:
            follower = procs.start("follower", [LEDGER, "projections", "run", "--follow", "--db", dsn], env)
        for url, proc in zip(emu_urls, emulators, strict=True):
            wait_healthy(url + "/health", proc)
        for url, proc in zip(gw_urls, gateways, strict=True):
            wait_healthy(url + "/_ledger/health", proc)
        warm = await drive(
            gw_urls, args.clients, 2.0, args.stream_tokens, args.prompt_bytes
        )  # connections, caches, JIT-free warm-up
        direct = await drive(emu_urls, args.clients, args.duration, args.stream_tokens, args.prompt_bytes)
        watched = {f"gateway{i}": p.pid for i, p in enumerate(gateways)}
        watched |= {f"emulator{i}": p.pid for i, p in enumerate(emulators)}
        if follower is not None:
            watched["follower"] = follower.pid
        cpu0 = {k: cpu_seconds(pid) for k, pid in watched.items()}
        pg0, busy0, self0 = postgres_cpu(), machine_busy(), os.times()
        head0 = await head_position(dsn)
        with LockSampler(dsn, name, args.sample_ms / 1000) as sampler:
            via = await drive(gw_urls, args.clients, args.duration, args.stream_tokens, args.prompt_bytes)
        pg1, busy1, self1 = postgres_cpu(), machine_busy(), os.times()
        committed = await head_position(dsn) - head0  # strict: every answered call is committed by now
        seconds = via.elapsed_s
        cpu = {k: round((cpu_seconds(pid) - cpu0[k]) / seconds, 3) for k, pid in watched.items()}
        cpu["load_generator"] = round((self1.user + self1.system - self0.user - self0.system) / seconds, 3)
        cpu["postgres"] = round(sum(v - pg0.get(pid, 0.0) for pid, v in pg1.items()) / seconds, 3)
        calls_per_s = via.ok / seconds
        machine = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
        catch_up = await follower_catch_up(dsn) if follower is not None else None
        procs.stop(("follower", "gateway"))
        for name_, proc in procs.children:
            if name_.startswith("gateway") and proc.returncode != 0:
                raise SystemExit(f"{name_} exited {proc.returncode}: see {tmp / name_}.log")
        verify = subprocess.run([LEDGER, "verify", "--db", dsn, "--format", "json"], capture_output=True, text=True)
        counts = await ledger_counts(dsn)
    finally:
        procs.stop()
        if not args.keep_db:
            admin = await asyncpg.connect(args.pg)
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            await admin.close()
    recorded = warm.ok + via.ok
    table_bytes = sum(int(str(row["pg_total_relation_size"])) for row in counts.sizes if row["relkind"] == "r")
    return {
        "gateways": n,
        "durability": args.durability,
        "follower": args.follower,
        "recorded_calls_per_s": round(calls_per_s, 1),
        "events_per_s": round(committed / seconds, 1),
        "direct_calls_per_s": round(direct.ok / direct.elapsed_s, 1),
        **added(direct, via),
        **sampler.summary(seconds),
        "cpu_cores": cpu,
        "cpu_ms_per_call": {k: round(v / calls_per_s * 1000, 3) for k, v in cpu.items()},
        "machine_busy_share": round(machine, 3),
        "follower_catch_up_s": catch_up,
        "verify_exit": verify.returncode,
        "verify": json.loads(verify.stdout) if verify.stdout.strip().startswith("{") else verify.stdout[-500:],
        "calls_seen_ok": recorded,
        "non_200": {k: v for k, v in (Counter(warm.status) + Counter(via.status)).items() if k != 200},
        "client_errors": dict(Counter(warm.errors) + Counter(via.errors)),
        "events": counts.events,
        "events_by_type": counts.types,
        "gap_free": counts.events == counts.last_position,
        "events_match_calls": counts.types.get("call.started") == recorded == counts.types.get("call.finished"),
        "blobs": counts.blobs,
        "payload_bytes_mean_by_type": counts.payload_bytes_by_type,
        "blob_bytes_mean": counts.blob_bytes_mean,
        "checkpoints": counts.checkpoints,
        "sizes": counts.sizes,
        "bytes_per_call_all_tables": round(table_bytes / max(1, recorded), 1),
    }


async def main(args: argparse.Namespace) -> list[dict[str, object]]:
    results = []
    for n in (int(v) for v in args.gateways.split(",")):
        results.append(await run_n(args, n))
        line = {k: v for k, v in results[-1].items() if k not in ("sizes", "verify")}
        if results[-1]["verify_exit"] != 0:
            line["verify"] = results[-1]["verify"]
        print(json.dumps(line), flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateways", default="1,2,4", help="comma-separated N to run, each on a fresh database")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase (direct, then gateways)")
    parser.add_argument("--clients", type=int, default=24, help="concurrent clients, half non-stream, half stream")
    parser.add_argument("--stream-tokens", type=int, default=8)
    parser.add_argument("--prompt-bytes", type=int, default=0, help="pad each prompt to this size (0: a short one)")
    parser.add_argument("--speed", type=float, default=100.0, help="emulator clock speed-up")
    parser.add_argument("--durability", choices=("strict", "async"), default="strict")
    parser.add_argument("--follower", action="store_true", help="run `ledger projections run --follow` beside them")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="pg_stat_activity / pg_locks sampling interval")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres", help="admin connection")
    parser.add_argument("--keep-db", action="store_true", help="leave scale_bench_N in place (for sizes, psql)")
    parser.add_argument("--out", type=Path, default=None, help="also write the full JSON here")
    arguments = parser.parse_args()
    summary = asyncio.run(main(arguments))
    if arguments.out is not None:
        arguments.out.write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))
