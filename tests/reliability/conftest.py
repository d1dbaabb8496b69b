"""Reliability fixtures: one fast emulator for the folder (real `ledger emulate` on a loopback port), and the
upstream of large (or hostile) answers (`big_upstream.py`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from usage_ledger.processes import free_port


@pytest.fixture(scope="package")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    proc = processes.emulator(tmp_path_factory.mktemp("emu"), speed=20).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="package")
def big_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    port = free_port()
    log = tmp_path_factory.mktemp("big") / "upstream.log"
    args = [sys.executable, "-m", "tests.reliability.big_upstream", str(port)]
    proc = Process(args, f"http://127.0.0.1:{port}/health", log).start()
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()
