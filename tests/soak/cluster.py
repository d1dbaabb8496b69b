"""A private PostgreSQL cluster the soak can stop and start: initdb + pg_ctl as the `postgres` user.

The shared server on 5432 is never touched: this cluster lives in its own temporary directory, on
its own free loopback port, with its socket in that directory. `stop("fast")` is a clean shutdown
(clients disconnected), `stop("immediate")` a crash (recovery from the WAL at the next start).
"""

from __future__ import annotations

import contextlib
import glob
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from usage_ledger.processes import free_port

__all__ = ("ClusterUnavailable", "PrivateCluster")

StopMode = Literal["fast", "immediate"]


class ClusterUnavailable(RuntimeError):
    """No PostgreSQL binaries, no `postgres` user or no `runuser` here."""


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found or shutil.which("runuser") is None:
        raise ClusterUnavailable("a private cluster needs /usr/lib/postgresql/*/bin/pg_ctl and runuser")
    return Path(found[-1]).parent


class PrivateCluster:
    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="soak-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "postgres.log"
        shutil.chown(self.root, "postgres", "postgres")
        self.running = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/ledger"

    def _as_postgres(self, tool: str, *args: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", str(self.bin / tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr or done.stdout}")

    def create(self) -> PrivateCluster:
        self._as_postgres("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()
        self._as_postgres("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "ledger")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        self.running = True

    def stop(self, mode: StopMode = "fast") -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def destroy(self) -> None:
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):  # removed below either way
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
