"""The real-vLLM tier: vLLM on CPU with a tiny model built here, one server per configuration.

vLLM runs with its own interpreter: `LEDGER_TEST_VLLM_PYTHON`, else `<repo>/.venv-vllm/bin/python`
(`make vllm-venv`). Without it every test here skips with a message saying how to run them —
unless `LEDGER_TEST_REQUIRE_VLLM=1` (set by CI), where they fail instead.

The tests ask for the configurations in `CONFIGS` order, so each starts once: `vllm_server(config)` stops the
previous configuration's server and starts the next one in the background, beside the tests of this one (a
start-up is mostly one core's imports and loading; the tests leave cores idle between calls). At most two servers
are alive; the last stops with the module, before the rest of the suite runs. They run eagerly, without
torch.compile's warm-up (servers.EAGER_ARGS).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.realvllm.servers import (
    CONFIGS,
    VllmServer,
    build_model,
    default_vllm_python,
    missing_vllm_message,
    start_vllm,
)


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
    """The server of the configuration the tests use now, and the next one's starting beside it."""

    def __init__(self, python: Path, model: Path, log_dir: Path) -> None:
        self.python = python
        self.model = model
        self.log_dir = log_dir
        self.current: VllmServer | None = None
        self.starts: list[tuple[str, float]] = []
        self._starting: dict[str, Future[VllmServer]] = {}
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="vllm-start")

    def get(self, config: str) -> VllmServer:
        if self.current is not None and self.current.config == config:
            return self.current
        self._stop_current()
        self.current = (self._starting.pop(config, None) or self._start(config)).result()
        self.starts.append((config, self.current.started_in_s))
        following = list(CONFIGS)[list(CONFIGS).index(config) + 1 :]
        if following and following[0] not in self._starting:
            self._starting[following[0]] = self._start(following[0])
        return self.current

    def close(self) -> None:
        self._stop_current()
        self._starter.shutdown(wait=True)
        for starting in self._starting.values():  # started for tests that did not run (a -k, a failure)
            if starting.exception() is None:
                starting.result().stop()
        self._starting.clear()

    def _start(self, config: str) -> Future[VllmServer]:
        return self._starter.submit(start_vllm, self.python, self.model, config, self.log_dir, eager=True)

    def _stop_current(self) -> None:
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
