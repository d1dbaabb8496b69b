"""The randomized fault soak: `python -m tests.soak.soak --minutes 30 --backend pg|sqlite --seed N`.

Real processes on loopback ports: `ledger emulate` behind a relay that can misbehave
(tests.soak.relay), `ledger serve` in front of it with strict durability and signed checkpoints,
its state and spool (and a SQLite ledger) on a tmpfs, a PostgreSQL ledger in a private cluster.
Clients call without pause (tests.soak.clients) while the gateway is killed, the database stopped
and the disk filled at random (tests.soak.faults). Checked live: every 200 received in full is in
the ledger whenever the spool is empty, no event twice, the chain verifies. At the end: the spool
drains, the projections reach the head and a rebuild gives the same rows, `ledger verify` passes
with the checkpoints, tokens equal the upstream's (tests.soak.invariants). Prints a JSON summary;
exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import msgspec

from tests.gateway import processes
from tests.reliability.helpers import ledger_cli, mounted_tmpfs, runs_report
from tests.soak import ending
from tests.soak.clients import RUN, Call, ClientMix
from tests.soak.cluster import PrivateCluster
from tests.soak.faults import Breaker, GatewayRunner
from tests.soak.invariants import LedgerScan, judge
from tests.soak.live import Live
from tests.soak.relay import UpstreamRelay

__all__ = ("SoakConfig", "main", "soak")


class SoakConfig(msgspec.Struct, frozen=True, kw_only=True):
    backend: str  # "pg" | "sqlite"
    seconds: float
    seed: int = 1
    workers: int = 8
    check_every_s: float = 10.0
    verify_every_s: float = 60.0
    mean_fault_gap_s: float = 4.0
    upstream_read_timeout_s: float = 4.0
    checkpoint_interval_s: float = 15.0
    work_dir: str = ""


async def _load(mix: ClientMix, config: SoakConfig, calls: list[Call], stop: asyncio.Event) -> None:
    async def worker(w: int) -> None:
        rng = random.Random(f"{config.seed}-client-{w}")
        limits = httpx.Limits(max_connections=4)
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5), limits=limits) as http:
            n = 0
            while not stop.is_set():
                call = await mix.call(http, rng, f"{w}.{n}")
                calls.append(call)
                n += 1
                if call.outcome.status is None:
                    await asyncio.sleep(0.2)  # the gateway is restarting: do not spin

    await asyncio.gather(*(worker(w) for w in range(config.workers)))


def _tmpfs_size(config: SoakConfig) -> str:
    # a SQLite ledger lives on it and grows; a spool only holds what an outage leaves
    return f"{128 + int(config.seconds / 60 * 40)}m" if config.backend == "sqlite" else "64m"


async def soak(config: SoakConfig) -> dict[str, object]:
    work = Path(config.work_dir or tempfile.mkdtemp(prefix="soak-"))
    rng = random.Random(config.seed)
    with contextlib.ExitStack() as stack:
        disk = stack.enter_context(mounted_tmpfs(work / "disk", _tmpfs_size(config)))
        cluster = None
        if config.backend == "pg":
            cluster = await asyncio.to_thread(PrivateCluster)
            stack.callback(cluster.destroy)
            await asyncio.to_thread(cluster.create)
            db_url = cluster.url
        else:
            db_url = f"sqlite:///{disk / 'ledger.db'}"
        await asyncio.to_thread(processes.upgrade, db_url)
        emulator = await asyncio.to_thread(processes.emulator(work, speed=20).start)
        stack.callback(emulator.stop)
        emulator_url: str = emulator.url  # type: ignore[attr-defined]
        relay = await UpstreamRelay(int(emulator_url.rsplit(":", 1)[1]), config.seed).start()
        keygen = await ledger_cli("keygen", "--out", str(work / "ledger.key"))
        assert keygen.returncode == 0, keygen.stderr
        checkpoints = work / "checkpoints"
        port = processes.free_port()
        env = {
            "LEDGER_UPSTREAM_READ_TIMEOUT_S": str(config.upstream_read_timeout_s),
            "LEDGER_CHECKPOINT_KEY": str(work / "ledger.key"),
            "LEDGER_CHECKPOINT_DIR": str(checkpoints),
            "LEDGER_CHECKPOINT_INTERVAL_S": str(config.checkpoint_interval_s),
        }
        state = ["--state-dir", str(disk / "state"), "--spool-dir", str(disk / "state" / "spool")]
        runner = GatewayRunner(lambda: processes.gateway(work, relay.url, db_url, *state, port=port, env=env))
        await asyncio.to_thread(runner.start)
        stack.callback(runner.stop)
        url = f"http://127.0.0.1:{port}"
        try:
            summary = await _drive(
                config, rng, runner, disk, cluster, db_url, url, emulator_url, checkpoints, work, relay.reached
            )
        finally:
            await relay.close()
        summary["relay_injected"] = dict(sorted(relay.injected.items()))
    return summary


async def _drive(
    config: SoakConfig,
    rng: random.Random,
    runner: GatewayRunner,
    disk: Path,
    cluster: PrivateCluster | None,
    db_url: str,
    url: str,
    emulator_url: str,
    checkpoints: Path,
    work: Path,
    relayed: dict[str, int],
) -> dict[str, object]:
    calls: list[Call] = []
    scan = LedgerScan()
    stop = asyncio.Event()
    sqlite_file = Path(db_url.removeprefix("sqlite:///")) if cluster is None else None
    breaker = Breaker(runner, disk, rng, cluster=cluster, sqlite_file=sqlite_file, mean_gap_s=config.mean_fault_gap_s)
    live = Live(db_url, url, calls, scan, check_every_s=config.check_every_s, verify_every_s=config.verify_every_s)
    mix = ClientMix(url, upstream_hang_s=config.upstream_read_timeout_s + 1)
    started = time.monotonic()
    tasks = [
        asyncio.create_task(_load(mix, config, calls, stop)),
        asyncio.create_task(breaker.run(stop)),
        asyncio.create_task(live.run(stop)),
    ]
    await asyncio.sleep(config.seconds)
    stop.set()
    await asyncio.gather(*tasks)
    soaked_s = time.monotonic() - started

    problems = list(live.violations)
    if not runner.alive():
        runner.died.append("not running at the end")
        await asyncio.to_thread(runner.start)
    problems += await ending.caught_up(url, db_url)
    followed = await ending.digests(db_url)
    await asyncio.to_thread(runner.stop)  # SIGTERM: drains, signs the last checkpoint
    await scan.advance(db_url)

    def context(call: Call) -> str:
        o = call.outcome
        faults = breaker.during(call.began, call.ended)
        return f"{call.kind} {o.call_id} status={o.status} error={o.error!r} faults={faults}"

    unrecorded = await asyncio.to_thread(ending.unrecorded_ends, work)
    verdict = await judge(
        db_url, calls, scan, runner.kills, await ending.upstream_log(emulator_url), unrecorded, context, relayed
    )
    [report] = await runs_report(db_url, RUN)
    tokens: dict[str, list[int]] = verdict.figures["tokens"]  # type: ignore[assignment]
    if [report["input_tokens"], report["output_tokens"]] != tokens["ledger_all_prompt_completion"]:
        problems.append(f"the runs report's tokens {report} differ from the ledger's {tokens}")
    if report["calls"] != len(scan.started):
        problems.append(f"the runs report counts {report['calls']} calls, the ledger {len(scan.started)}")
    rebuild = await ledger_cli("rebuild", "--db", db_url)
    if rebuild.returncode != 0:
        problems.append(f"ledger rebuild exited {rebuild.returncode}: {rebuild.stderr[-2000:]}")
    elif (rebuilt := await ending.digests(db_url)) != followed:
        problems.append(f"a rebuild's rows differ from the follower's: {followed} vs {rebuilt}")
    verified, orphans = await ending.verify(db_url, checkpoints, work / "ledger.key.pub")
    problems += verified
    problems += [f"gateway {d}" for d in runner.died]
    problems += [f"a fault could not be injected or undone: {e}" for e in breaker.errors]
    if sqlite_file is not None:  # the tmpfs goes at the end: keep the ledger for a post-mortem
        await asyncio.to_thread(ending.backup, sqlite_file, work / "ledger.db")
    faults = Counter(breaker.injected)
    faults.update(c.kind for c in calls if c.kind not in ("plain", "stream"))
    stuck = [s for s in verdict.stuck + problems if s.startswith("stuck")]
    return {
        "backend": config.backend,
        "seed": config.seed,
        "seconds": round(soaked_s, 1),
        **verdict.figures,
        "faults": dict(sorted(faults.items())),
        "fault_overlaps": breaker.overlaps,
        "gateway_restart_attempts_failed": len(runner.failed_starts),
        "report": {
            k: report[k] for k in ("calls", "failed_calls", "incomplete_calls", "input_tokens", "output_tokens")
        },
        "orphan_blobs": orphans,
        "checkpoints": len(await asyncio.to_thread(lambda: list(checkpoints.glob("checkpoint-*.txt")))),
        "live_checks": dict(live.rounds),
        "lost": len(verdict.lost),
        "duplicated": len(verdict.duplicated),
        "stuck": len(verdict.stuck) + len(stuck),
        "token_mismatches": len(verdict.tokens),
        "violations": (verdict.violations + problems)[:50],
        "ok": not (verdict.violations or problems),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--backend", choices=["pg", "sqlite"], default="pg")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--work-dir", default="", help="kept afterwards (logs, checkpoints); default: a new temp dir")
    args = parser.parse_args(argv)
    config = SoakConfig(
        backend=args.backend, seconds=args.minutes * 60, seed=args.seed, workers=args.workers, work_dir=args.work_dir
    )
    summary = asyncio.run(soak(config))
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(summary)).decode() + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
