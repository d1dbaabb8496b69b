"""The gateway's overhead in front of real vLLM (CPU, the tier's tiny model): direct vs gateway, same run.

    .venv/bin/python bench/real_vllm.py [--config defaults] [bench/gateway.py options ...]

Builds the tiny model and starts vLLM as the real-vLLM tier does (`make vllm-venv` first; see
docs/real-vllm.md), then runs `bench/gateway.py --upstream <vLLM> --model tiny` with the options
given, prints its JSON summary and stops vLLM. The model is random: its speed says nothing about
a GPU; what matters is the gateway's figures against the direct path measured in the same rounds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.realvllm.servers import MODEL_NAME, build_model, default_vllm_python, start_vllm  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="defaults", help="a configuration of tests/realvllm/servers.py")
    args, rest = parser.parse_known_args()
    python = default_vllm_python()
    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    model = build_model(python, tmp / "model")
    server = start_vllm(python, model, args.config, tmp)
    try:
        bench = [sys.executable, str(REPO / "bench" / "gateway.py"), "--upstream", server.url, "--model", MODEL_NAME]
        return subprocess.run([*bench, *rest], check=False).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
