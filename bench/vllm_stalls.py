"""How often real vLLM (CPU, the tier's tiny model) generates a whole stream before its client can leave.

    .venv/bin/python bench/vllm_stalls.py [--config force_usage_metrics] [--streams 20] [--busy 1]

Starts vLLM as the real-vLLM tier does (`make vllm-venv` first), then, straight to vLLM with no
gateway and nothing sampling its /metrics, sends `--streams` long sampled chat streams whose client
leaves at the fourth chunk (`tests/realvllm/leave.py`, the abort test's stream), each between two
reads of vLLM's counters. A stream "ran to the end" when vLLM counted it as a finished request.
`--busy N` keeps N more processes spinning on the cores meanwhile. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.realvllm import harness  # noqa: E402
from tests.realvllm.leave import leave_stream  # noqa: E402
from tests.realvllm.servers import MODEL_NAME, build_model, default_vllm_python, start_vllm  # noqa: E402


def _spin() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="force_usage_metrics", help="a configuration of tests/realvllm/servers.py")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--busy", type=int, default=0, help="extra busy processes while the streams run")
    args = parser.parse_args()
    python = default_vllm_python()
    tmp = Path(tempfile.mkdtemp(prefix="bench-stalls-"))
    server = start_vllm(python, build_model(python, tmp / "model"), args.config, tmp)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    try:
        client = harness.sdk_client(server.url)
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=1, temperature=0
        )
        for spinner in spinners:
            spinner.start()
        ran_to_end, waits = 0, []
        for _ in range(args.streams):
            before = harness.scrape_counters(server.url)
            waits.append(leave_stream(client))
            ran_to_end += (harness.scrape_counters(server.url) - before).calls
        summary = {
            "config": args.config,
            "busy": args.busy,
            "streams": args.streams,
            "ran_to_end": ran_to_end,
            "fourth_chunk_s_median": round(statistics.median(waits), 3),
            "fourth_chunk_s_max": round(max(waits), 3),
        }
        print(json.dumps(summary))
        return 0
    finally:
        for spinner in spinners:
            spinner.terminate()
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
