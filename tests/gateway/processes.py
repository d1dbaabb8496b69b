"""Real processes on loopback ports for end-to-end tests: `ledger emulate` and `ledger serve`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.ledger.helpers import build_ledger
from usage_ledger.processes import free_port

LEDGER = str(Path(sys.executable).parent / "ledger")


class Process:
    def __init__(self, args: Sequence[str], health_url: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.health_url = health_url
        self.log_path = log
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90.0) -> Process:  # a loaded 2-core box imports for tens of seconds
        self.log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.args} exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.health_url, timeout=1).status_code in (200, 503):  # up; 503: degraded, says why
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.kill()  # never left running behind a failed start
        self.log.close()
        raise RuntimeError(f"{self.args} not healthy in {timeout_s}s:\n{self.log_path.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        self.log.close()


def emulator(tmp: Path, *extra: str, speed: float = 20) -> Process:
    port = free_port()
    args = [
        LEDGER,
        "emulate",
        "--port",
        str(port),
        "--profile",
        "moe",
        "--speed",
        str(speed),
        "--log-level",
        "warning",
        *extra,
    ]
    proc = Process(args, f"http://127.0.0.1:{port}/health", tmp / f"emulator-{port}.log")
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return proc


def upgrade(db_url: str) -> None:
    """The ledger at `db_url` migrated, in this process (callable from a running loop too): `ledger db upgrade`
    would spend a second importing the CLI before each gateway test; the command has tests of its own."""
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, build_ledger(db_url)).result()


def gateway(
    tmp: Path, upstream: str, db_url: str, *extra: str, port: int | None = None, env: dict[str, str] | None = None
) -> Process:
    port = port or free_port()
    args = [
        LEDGER,
        "serve",
        "--upstream",
        upstream,
        "--port",
        str(port),
        "--db",
        db_url,
        "--spool-dir",
        str(tmp / "spool"),
        *extra,
    ]
    proc = Process(
        args,
        f"http://127.0.0.1:{port}/_ledger/health",
        tmp / f"gateway-{port}.log",
        env={"LEDGER_LOG_FORMAT": "json", **(env or {})},
    )
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    proc.port = port  # type: ignore[attr-defined]
    return proc
