"""The projection follower of `ledger serve`, in a child process.

Run on the gateway's own event loop, each catch-up pass (decoding events, folding and writing
read-model rows) stalled the proxy: measured with `bench/gateway.py`, it added ≈10 ms median and
≈190 ms p99 to every call. A child process keeps the read models current on the other core, and
the proxy's loop only proxies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import structlog

from usage_ledger.ledger import Database
from usage_ledger.processes import stop_process

__all__ = ("follower_process", "otel_follower_process", "projections_follower_process")

log = structlog.get_logger("usage_ledger.followers")

# The child asks Linux for SIGTERM when the gateway dies (even by SIGKILL), then runs `ledger ...`;
# done in the child itself because a preexec_fn is unsafe in a threaded parent.
# argv[1] is the gateway's pid: if it died before prctl took effect, the child exits at once.
_DIE_WITH_PARENT_THEN_EXEC = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform == 'linux':\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(0)\n"
    "from usage_ledger.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


async def projections_follower_process(database: Database) -> None:
    """Run `ledger projections run --follow` for as long as the gateway runs; restart it if it exits."""
    await follower_process(database, "projections", "run", "--follow")


async def otel_follower_process(database: Database) -> None:
    """Run `ledger otel export --follow` beside the gateway (`ledger serve` starts it when LEDGER_OTEL_EXPORT=1)."""
    await follower_process(database, "otel", "export", "--follow")


async def follower_process(database: Database, *command: str) -> None:
    """Run `ledger <command>` as a child for as long as the gateway runs; restart it if it exits."""
    args = [sys.executable, "-c", _DIE_WITH_PARENT_THEN_EXEC, str(os.getpid()), *command]
    env = {**os.environ, "LEDGER_DATABASE_URL": database.url}  # not argv: a password would show in `ps`
    delay = 1.0
    while True:
        started = time.monotonic()
        child = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL, env=env)
        try:
            code = await child.wait()
        except asyncio.CancelledError:
            await stop_process(child, signal.SIGTERM, 10.0)
            raise
        if time.monotonic() - started > 60:
            delay = 1.0  # it had been running fine: restart promptly
        log.warning("follower_exited", command=" ".join(command), code=code, restart_in_s=delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 60.0)  # e.g. the database is down: retry, but don't spin
