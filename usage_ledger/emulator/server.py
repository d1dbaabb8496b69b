"""Run the emulator: `serve(...)` (the CLI) and `running_emulator(...)` (in-process, for tests)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator

import msgspec
import uvicorn

from usage_ledger.emulator.app import EmulatorApp, create_app
from usage_ledger.emulator.config import PROFILES, EmulatorConfig
from usage_ledger.emulator.engine import RequestRecord

__all__ = ("RunningEmulator", "running_emulator", "serve")


def _uvicorn_config(app: EmulatorApp, host: str, port: int, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=2,
    )


async def serve(config: EmulatorConfig, host: str = "127.0.0.1", port: int = 8200, log_level: str = "info") -> None:
    """Serve until cancelled or interrupted (SIGINT/SIGTERM)."""
    server = uvicorn.Server(_uvicorn_config(create_app(config), host, port, log_level))
    # Start-up objects live as long as the process: out of GC scans. A full collection traversed
    # ~100k of them (44 ms by a `gc.callbacks` probe, an estimate), a stall the timing model knows
    # nothing about. (`ledger.heap.freeze_startup_heap` does the same; the emulator imports no ledger code.)
    gc.collect()
    gc.freeze()
    await server.serve()


class RunningEmulator:
    """An emulator serving on a loopback port inside the current event loop."""

    def __init__(self, app: EmulatorApp, base_url: str):
        self.app = app
        self.base_url = base_url

    @property
    def config(self) -> EmulatorConfig:
        return self.app.config

    def records(self) -> list[RequestRecord]:
        """Finished requests with their emulated timings (same as `GET /emulator/requests`)."""
        return list(self.app.engine.records)


@contextlib.asynccontextmanager
async def running_emulator(config: EmulatorConfig | None = None, **overrides: object) -> AsyncIterator[RunningEmulator]:
    """Start the emulator on 127.0.0.1 and a free port; yields a handle with `base_url`.

    `overrides` replace fields of `config` (default: the `moe` profile).
    """
    cfg = msgspec.structs.replace(config or PROFILES["moe"], **overrides)
    app = create_app(cfg)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # proto set: asyncio then sets NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(_uvicorn_config(app, "127.0.0.1", port, "warning"))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the emulator stopped during start-up")
            await asyncio.sleep(0.005)
        yield RunningEmulator(app, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        try:
            await task
        finally:
            sock.close()
