"""Child processes on loopback ports (the emulator, the gateway), started and stopped cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from usage_ledger.ledger import wait_up_to

__all__ = ("Child", "free_port", "start_child", "stop_process")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Child:
    """A running child process; `stop()` sends SIGINT (a graceful shutdown), then SIGKILL."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path

    async def stop(self, timeout_s: float = 15.0) -> None:
        await stop_process(self.process, signal.SIGINT, timeout_s)


async def stop_process(process: asyncio.subprocess.Process, sig: int, timeout_s: float) -> None:
    """Send `sig` to a running process and wait for it; SIGKILL if it has not exited after `timeout_s`."""
    if process.returncode is not None:
        return
    process.send_signal(sig)
    if not await wait_up_to(process.wait(), timeout_s):
        process.kill()
        await process.wait()


async def start_child(name: str, args: Sequence[str], ready_url: str, log_dir: Path, timeout_s: float = 30.0) -> Child:
    """Start `python args...` and wait until `ready_url` answers 200; output goes to `log_dir/name.log`."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdout=log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL
        )
    child = Child(name, process, log_path)
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=1.0) as client:
        while time.monotonic() < deadline and process.returncode is None:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(ready_url)).status_code == 200:
                    return child
            await wait_up_to(process.wait(), 0.1)
    await child.stop()
    raise RuntimeError(f"{name} did not become ready at {ready_url} (exit code {process.returncode}); see {log_path}")
