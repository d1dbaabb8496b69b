"""What the soak breaks besides requests: the gateway process, the database, the disk.

- `kill`: SIGKILL of `ledger serve` (strict durability), restarted on the same port at once.
- `pause`: SIGSTOP of `ledger serve` for 1-9 s, then SIGCONT (a paused VM, a long GC): past
  `LEDGER_PG_IDLE_IN_TRANSACTION_TIMEOUT_S` the server ends a transaction it held the chain's head in, and
  what it was appending goes to the spool when it wakes. Never at once with `kill` (one gateway process).
- `db_stop` / `db_crash` (PostgreSQL): the private cluster stopped with `pg_ctl -m fast` / `-m immediate`
  for a while, then started again.
- `db_lock` (SQLite, which has no server to stop): another process holds an exclusive lock, so every
  write waits (the gateway's busy timeout is 30 s). The outage SQLite can also have, an unwritable file,
  needs `chattr +i`, which tmpfs does not support; `tests/reliability/test_outage.py` covers it on ext4.
- `disk_full`: the tmpfs holding the gateway's state and spool (and a SQLite ledger) filled with `dd`
  for a while, then freed.

Faults of different kinds may overlap (a kill while the disk is full, a full spool disk while the
database is down); a kind never overlaps itself, nor a database fault another.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.gateway.processes import Process
from tests.soak.cluster import PrivateCluster

__all__ = ("Breaker", "GatewayRunner")

_RESTART_WITHIN_S = 120.0


@dataclass
class GatewayRunner:
    """`ledger serve` on one port, restarted after every kill; counts the moments it was killed."""

    make: Callable[[], Process]
    gateway: Process | None = None
    kills: list[float] = field(default_factory=list)  # time.time() of each SIGKILL
    failed_starts: list[str] = field(default_factory=list)
    died: list[str] = field(default_factory=list)  # exits nobody asked for

    def start(self) -> None:
        deadline = time.monotonic() + _RESTART_WITHIN_S
        while True:
            gateway = self.make()
            try:
                gateway.start()
            except RuntimeError as exc:
                gateway.log.close()
                self.failed_starts.append(str(exc).splitlines()[0])
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)  # e.g. a full disk: retried until it starts
                continue
            self.gateway = gateway
            return

    def alive(self) -> bool:
        return self.gateway is not None and self.gateway.proc is not None and self.gateway.proc.poll() is None

    def kill(self) -> None:
        assert self.gateway is not None
        if not self.alive():
            self.died.append(f"exited {self.gateway.proc.returncode if self.gateway.proc else None} before its kill")
        self.kills.append(time.time())
        self.gateway.kill()
        self.gateway.log.close()
        self.gateway = None

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None


def _resource(kind: str) -> str:
    """What a fault holds while it runs: two database faults never overlap each other, nor a kill a pause."""
    if kind.startswith("db_"):
        return "database"
    return "gateway" if kind in ("kill", "pause") else kind


def _hold_exclusive_lock(path: Path, seconds: float) -> bool:
    """False when the lock could not be taken: a full disk (`disk_full` at the same time) keeps a WAL database's
    lock from another process too, so the gateway meets the full disk, not the lock."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        try:
            conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as exc:
            if "disk I/O error" in str(exc) or "full" in str(exc):
                return False
            raise
        time.sleep(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return True


class Breaker:
    """Injects the process, database and disk faults at random moments until `stop` is set."""

    def __init__(
        self,
        runner: GatewayRunner,
        disk: Path,
        rng: random.Random,
        *,
        cluster: PrivateCluster | None = None,
        sqlite_file: Path | None = None,
        mean_gap_s: float = 4.0,
    ) -> None:
        self.runner = runner
        self.disk = disk
        self.rng = rng
        self.cluster = cluster
        self.sqlite_file = sqlite_file
        self.mean_gap_s = mean_gap_s
        self.injected: Counter[str] = Counter()
        self.overlaps = 0
        self.busy: set[str] = set()
        self.timeline: list[tuple[str, float, float]] = []  # (kind, start, end) in time.time()
        self.errors: list[str] = []
        self.gateway_down = asyncio.Event()
        kinds: dict[str, Callable[[], Awaitable[None]]] = {
            "kill": self._kill,
            "pause": self._pause,
            "disk_full": self._disk_full,
        }
        if cluster is not None:
            kinds |= {"db_stop": self._db_stop, "db_crash": self._db_crash}
        else:
            kinds["db_lock"] = self._db_lock
        self.kinds = kinds

    async def run(self, stop: asyncio.Event) -> None:
        # every kind once, in a random order, then random draws
        order = list(self.kinds)
        self.rng.shuffle(order)
        tasks: list[asyncio.Task[None]] = []
        while not stop.is_set():
            with_gap = self.rng.expovariate(1 / self.mean_gap_s)
            try:
                await asyncio.wait_for(stop.wait(), with_gap)
                break
            except TimeoutError:
                pass
            kind = order.pop(0) if order else self.rng.choice(list(self.kinds))
            if _resource(kind) in self.busy:
                if not self.injected[kind]:
                    order.append(kind)  # not tried once yet: later
                continue
            if self.busy:
                self.overlaps += 1
            self.busy.add(_resource(kind))
            self.injected[kind] += 1
            tasks.append(asyncio.create_task(self._run(kind)))
        for task in asyncio.as_completed(tasks):
            try:
                await task
            except Exception as exc:  # a fault that could not be undone is a finding, not a crash of the soak
                self.errors.append(f"{type(exc).__name__}: {exc}")

    async def _run(self, kind: str) -> None:
        start = time.time()
        try:
            await self.kinds[kind]()
        finally:
            self.busy.discard(_resource(kind))
            self.timeline.append((kind, start, time.time()))

    def during(self, start: float, end: float) -> list[str]:
        """The faults that ran at some moment between `start` and `end`."""
        return [f"{kind}@{s - start:+.1f}s" for kind, s, e in self.timeline if s <= end and e >= start]

    async def _kill(self) -> None:
        self.gateway_down.set()
        await asyncio.to_thread(self.runner.kill)
        await asyncio.sleep(self.rng.uniform(0, 1))
        await asyncio.to_thread(self.runner.start)
        self.gateway_down.clear()

    async def _pause(self) -> None:
        gateway = self.runner.gateway
        if gateway is None or gateway.proc is None or not self.runner.alive():
            return  # between a kill and its restart: nothing to pause
        pid = gateway.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(self.rng.uniform(1, 9))
        finally:
            os.kill(pid, signal.SIGCONT)

    async def _db_stop(self) -> None:
        await self._db_down("fast")

    async def _db_crash(self) -> None:
        await self._db_down("immediate")

    async def _db_down(self, mode: str) -> None:
        assert self.cluster is not None
        await asyncio.to_thread(self.cluster.stop, mode)  # type: ignore[arg-type]
        await asyncio.sleep(self.rng.uniform(0.5, 6))
        await asyncio.to_thread(self.cluster.start)

    async def _db_lock(self) -> None:
        assert self.sqlite_file is not None
        if not await asyncio.to_thread(_hold_exclusive_lock, self.sqlite_file, self.rng.uniform(0.5, 6)):
            self.injected["db_lock_met_a_full_disk"] += 1

    async def _disk_full(self) -> None:
        filler = self.disk / "filler"
        dd = ["dd", "if=/dev/zero", f"of={filler}", "bs=64k"]  # until ENOSPC
        await asyncio.to_thread(subprocess.run, dd, capture_output=True, check=False)
        try:
            await asyncio.sleep(self.rng.uniform(0.5, 5))
        finally:
            filler.unlink()
