"""The real-vLLM tier: vLLM on CPU with a tiny model built here, one server per configuration.

vLLM runs with its own interpreter: `LEDGER_TEST_VLLM_PYTHON`, else `<repo>/.venv-vllm/bin/python`
(`make vllm-venv`). Without it every test here skips with a message saying how to run them —
unless `LEDGER_TEST_REQUIRE_VLLM=1` (set by CI), where they fail instead.

Servers start one at a time (two cores): `vllm_server(config)` stops the previous configuration's
server before it starts the next one, and the tests ask for configurations in order, so each starts
once; the last one stops with the module, before the rest of the suite runs. They run eagerly, without
torch.compile's warm-up (servers.EAGER_ARGS).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.realvllm.servers import VllmServer, build_model, default_vllm_python, missing_vllm_message, start_vllm


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM interpreter; without one the test module has already skipped, unless the tier is required."""
    python = default_vllm_python()
    if not python.exists():
        pytest.fail(missing_vllm_message(python))
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama (build_model.py), built once per session."""
    return build_model(vllm_python, tmp_path_factory.mktemp("tiny-model"))


class ServerPool:
    """At most one vLLM server alive at a time; asking for another configuration stops the current one."""

    def __init__(self, python: Path, model: Path, log_dir: Path) -> None:
        self.python = python
        self.model = model
        self.log_dir = log_dir
        self.current: VllmServer | None = None
        self.starts: list[tuple[str, float]] = []

    def get(self, config: str) -> VllmServer:
        if self.current is not None and self.current.config == config:
            return self.current
        self.close()
        self.current = start_vllm(self.python, self.model, config, self.log_dir, eager=True)
        self.starts.append((config, self.current.started_in_s))
        return self.current

    def close(self) -> None:
        if self.current is not None:
            server, self.current = self.current, None
            server.stop()


STARTS = pytest.StashKey[list[tuple[str, float]]]()


@pytest.fixture(scope="module")
def vllm_pool(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerPool]:
    pool = ServerPool(vllm_python, tiny_model, tmp_path_factory.mktemp("vllm-logs"))
    request.config.stash[STARTS] = pool.starts
    try:
        yield pool
    finally:
        pool.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """One line for CI logs: how long each vLLM configuration took to start."""
    starts = config.stash.get(STARTS, [])
    if starts:
        summary = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in starts)
        terminalreporter.write_line(f"real-vLLM tier: vLLM start-ups: {summary}")


@pytest.fixture(scope="module")
def vllm_server(vllm_pool: ServerPool) -> Callable[[str], VllmServer]:
    """`vllm_server(config)`: the running vLLM for `config` (servers.CONFIGS), started on first use."""
    return vllm_pool.get
