"""The dashboard's fixtures: a seeded SQLite ledger, `ledger ui` over it (open, and behind a token),
and headless Debian chromium driven by Playwright with the system executable (never `playwright install`).

Without chromium the browser tests skip, unless LEDGER_TEST_REQUIRE_BROWSER=1 (CI), where they fail.
Screenshots go to a pytest temporary directory and, when LEDGER_TEST_SCREENSHOT_DIR is set, there too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ledger.helpers import build_ledger
from tests.ui.seed import seed_busy_ledger, seed_ledger, seed_wide_ledger
from usage_ledger.ledger.db import Database

TOKEN = "s3cret-admin-token"
CHROMIUM = os.environ.get("LEDGER_TEST_CHROMIUM", "/usr/bin/chromium")


@dataclass(frozen=True)
class UiServer:
    base: str
    url: str
    """The ledger's database URL."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_async(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `work` to completion on a thread of its own: Playwright's sync API keeps a loop running on this one."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(work())).result()


def seeded_ledger(path: Path, seed: Callable[[Database], Coroutine[Any, Any, None]] = seed_ledger) -> str:
    url = f"sqlite:///{path}"

    async def build() -> None:
        await build_ledger(url, seed)

    run_async(build)
    return url


def start_ui(url: str, *, token: str | None = None) -> tuple[subprocess.Popen[bytes], UiServer]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env.update(LEDGER_TZ="UTC", LEDGER_LOG_LEVEL="warning")
    if token is not None:
        env["LEDGER_ADMIN_TOKEN"] = token
    process = subprocess.Popen(
        [sys.executable, "-m", "usage_ledger.cli", "ui", "--db", url, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/_ledger/ui/login", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"ledger ui did not start on port {port} (exit {process.poll()})")
        time.sleep(0.1)
    return process, UiServer(base=base, url=url)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def ledger_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return seeded_ledger(tmp_path_factory.mktemp("ui-ledger") / "ledger.db")


@pytest.fixture(scope="module")
def open_ui(ledger_url: str) -> Iterator[UiServer]:
    process, server = start_ui(ledger_url)
    try:
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="module")
def wide_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    """`ledger ui` over seed_wide_ledger: numbers wide enough to find a clipped axis."""
    process, server = start_ui(seeded_ledger(tmp_path_factory.mktemp("ui-wide") / "ledger.db", seed_wide_ledger))
    try:
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="module")
def busy_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    """`ledger ui` over seed_busy_ledger: many categories with long labels, a run whose calls all failed."""
    process, server = start_ui(seeded_ledger(tmp_path_factory.mktemp("ui-busy") / "ledger.db", seed_busy_ledger))
    try:
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="module")
def guarded_ui(ledger_url: str) -> Iterator[UiServer]:
    process, server = start_ui(ledger_url, token=TOKEN)
    try:
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        if os.environ.get("LEDGER_TEST_REQUIRE_BROWSER") == "1":
            pytest.fail(f"no chromium at {CHROMIUM} but LEDGER_TEST_REQUIRE_BROWSER=1: apt-get install -y chromium")
        pytest.skip("browser tests need Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def screenshot_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    dirs = [tmp_path_factory.mktemp("screenshots")]
    if extra := os.environ.get("LEDGER_TEST_SCREENSHOT_DIR"):
        dirs.append(Path(extra))
        dirs[-1].mkdir(parents=True, exist_ok=True)
    return dirs
