"""What `bench/scale.py` watches while it drives the gateways: the append lock, CPU of PostgreSQL and the machine.

`LockSampler` samples `pg_stat_activity` joined with `pg_locks` from its own connection (nothing
is added to the gateway): who holds the append lock (the row of `ledger_head`, locked by
`SELECT … FOR UPDATE`), who waits for it, and what the holder is doing meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
from gateway import cpu_seconds

# A row lock is not listed in pg_locks, but the transaction that took it holds a lock on the table
# (`RowShareLock`) until its COMMIT ends: the holder is the backend with that lock that is not itself
# waiting for a lock; the others with it wait for the holder (`Lock:transactionid` or `Lock:tuple`).
SAMPLE_SQL = """
SELECT a.state, a.wait_event_type, a.wait_event,
       CASE WHEN h.pid IS NULL THEN NULL ELSE a.wait_event_type IS DISTINCT FROM 'Lock' END AS granted
FROM pg_stat_activity a
LEFT JOIN (SELECT DISTINCT pid FROM pg_locks
           WHERE locktype = 'relation' AND relation = to_regclass('ledger_head') AND granted) h ON h.pid = a.pid
WHERE a.datname = $1 AND a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
"""


class LockSampler:
    """pg_stat_activity x pg_locks every `interval` s, on its own thread and event loop (the load
    generator's loop is saturated: samples taken there would bunch up between its turns)."""

    def __init__(self, dsn: str, datname: str, interval: float) -> None:
        self.dsn, self.datname, self.interval = dsn, datname, interval
        self.samples = 0
        self.held = 0  # samples in which a backend held the append lock
        self.waiting = 0  # backend-samples waiting for it
        self.waits: Counter[str] = Counter()  # backend-samples by what a backend not waiting for the lock did
        self.holder: Counter[str] = Counter()  # samples by what the lock's holder did (its state, wait event)
        self.commits = 0  # transactions committed in the database meanwhile, the sampler's own excluded
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        commits_sql = "SELECT xact_commit FROM pg_stat_database WHERE datname = $1"
        try:
            first = await conn.fetchval(commits_sql, self.datname)
            next_at = time.perf_counter()
            while not self._stop.is_set():
                rows = await conn.fetch(SAMPLE_SQL, self.datname)
                self.samples += 1
                self.held += any(r["granted"] is True for r in rows)
                for r in rows:
                    doing = _doing(r["state"], r["wait_event_type"], r["wait_event"])
                    if r["granted"] is False:
                        self.waiting += 1
                    elif r["granted"] is True:
                        self.holder[doing] += 1
                    elif r["state"] != "idle":
                        self.waits[doing] += 1
                next_at += self.interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            await asyncio.sleep(1.1)  # backends flush their counts at most once a second (PostgreSQL 15)
            self.commits = await conn.fetchval(commits_sql, self.datname) - first - self.samples - 1
        finally:
            await conn.close()

    def summary(self, seconds: float) -> dict[str, object]:
        n = max(1, self.samples)
        return {
            "samples": self.samples,
            "lock_held_share": round(self.held / n, 3),
            "lock_wait_backend_s": round(self.waiting * self.interval, 2),
            "lock_wait_backends_mean": round(self.waiting / n, 3),
            "lock_wait_share_of_phase": round(self.waiting * self.interval / seconds, 3),
            "append_commits_per_s": round(self.commits / seconds, 1),
            "lock_held_ms_per_commit": round(self.held / n * seconds / max(1, self.commits) * 1000, 2),
            "lock_holder_share_by_activity": {k: round(v / n, 3) for k, v in self.holder.most_common(8)},
            "other_backends_by_activity_mean": {k: round(v / n, 3) for k, v in self.waits.most_common(8)},
        }


def _doing(state: str | None, wait_type: str | None, wait_event: str | None) -> str:
    """`idle in transaction`: the backend waits for its client's next statement (the gateway's own
    turn inside the transaction); `active` with no wait event: running on a CPU."""
    if state != "active":
        return str(state)
    return f"active:{wait_type}:{wait_event}" if wait_event else "active:CPU"


def postgres_cpu() -> dict[int, float]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    out[int(entry.name)] = cpu_seconds(int(entry.name))
    return out


def machine_busy() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)
