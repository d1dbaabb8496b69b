"""Reliability fixtures: one fast emulator for the folder (real `ledger emulate` on a loopback port)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway import processes
from tests.gateway.processes import Process


@pytest.fixture(scope="package")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    proc = processes.emulator(tmp_path_factory.mktemp("emu"), speed=20).start()
    try:
        yield proc
    finally:
        proc.stop()
