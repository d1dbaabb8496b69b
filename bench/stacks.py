"""Gateway stacks side by side: the same benchmarks for each interpreter given, interleaved, in one run.

    .venv/bin/python bench/stacks.py --stack base=/work/base/.venv/bin/python --stack new=.venv/bin/python \
        [--runs 3] [--vllm] [--out results.jsonl]

Each `--stack NAME=PYTHON` is a venv whose `ledger serve` is measured (a worktree of another commit
has its own). Per run, in a shuffled stack order: `bench/gateway.py` (emulator upstream; the
arguments of BENCHMARKS' reference rows) and `bench/saturated.py` (CPU-saturated SSE upstream); with `--vllm`, one real vLLM (CPU
tier, tests/realvllm) is started once and `bench/gateway.py --upstream` runs against it for every
stack in the same turns. Every result is a JSON line (stack, bench, run, the script's summary);
the medians per stack and figure are printed at the end. Each timed run holds `--lock` (flock), so other
work on the box can wait between runs instead of running beside them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
# the arguments of BENCHMARKS' "Today's figures" rows, so the side-by-side and that table are one measurement
GATEWAY_ARGS = ["--rounds", "3", "--calls", "200", "--tokens", "1470", "--rss-calls", "500", "--speed", "5"]
VLLM_ARGS = ["--rounds", "3", "--calls", "100", "--tokens", "200", "--streams", "4", "--rss-calls", "200"]
SATURATED_ARGS = ["--rounds", "3", "--streams", "4", "--chunks", "1000"]
FIGURES = (
    "added_latency_median_ms",
    "added_ttft_median_ms",
    "chunks_ratio",
    "gateway_cpu_us_per_chunk_all_rounds",
    "gateway_cpu_us_per_chunk",
)


def run(python: str, script: str, args: list[str], lock: str) -> dict[str, object] | None:
    command = ["flock", lock, python, str(BENCH / script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        print(f"FAILED {python} {script}: {done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout[done.stdout.index("{") :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", action="append", required=True, help="NAME=PYTHON")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vllm", action="store_true", help="also against real vLLM (CPU tier)")
    parser.add_argument("--vllm-runs", type=int, default=2)
    parser.add_argument("--skip-emulator", action="store_true")
    parser.add_argument("--out", default="stacks.jsonl")
    parser.add_argument("--lock", default="/tmp/bench.lock", help="a file each timed run holds (flock)")
    args = parser.parse_args()
    stacks = dict(item.split("=", 1) for item in args.stack)
    results: list[dict[str, object]] = []
    out = open(args.out, "a")  # one line per result, as they come

    def note(stack: str, bench: str, turn: int, summary: dict[str, object] | None) -> None:
        if summary is None:
            return
        line = {"stack": stack, "bench": bench, "run": turn, **summary}
        results.append(line)
        out.write(json.dumps(line) + "\n")
        out.flush()

    for turn in range(args.runs if not args.skip_emulator else 0):
        order = list(stacks)
        random.Random(turn).shuffle(order)
        for name in order:
            note(name, "gateway", turn, run(stacks[name], "gateway.py", GATEWAY_ARGS, args.lock))
            note(name, "saturated", turn, run(stacks[name], "saturated.py", SATURATED_ARGS, args.lock))
    if args.vllm:
        sys.path.insert(0, str(REPO))
        from tests.realvllm.servers import MODEL_NAME, build_model, default_vllm_python, start_vllm

        python = default_vllm_python()
        tmp = Path(tempfile.mkdtemp(prefix="bench-stacks-vllm-"))
        server = start_vllm(python, build_model(python, tmp / "model"), "defaults", tmp)
        try:
            for turn in range(args.vllm_runs):
                order = list(stacks)
                random.Random(100 + turn).shuffle(order)
                for name in order:
                    extra = ["--upstream", server.url, "--model", MODEL_NAME]
                    note(name, "real_vllm", turn, run(stacks[name], "gateway.py", [*VLLM_ARGS, *extra], args.lock))
        finally:
            server.stop()
    out.close()
    table: dict[str, dict[str, float]] = {}
    for bench in ("gateway", "saturated", "real_vllm"):
        for figure in FIGURES:
            for name in stacks:
                values = [
                    float(line[figure])  # type: ignore[arg-type]
                    for line in results
                    if line["bench"] == bench and line["stack"] == name and isinstance(line.get(figure), int | float)
                ]
                if values:
                    table.setdefault(f"{bench}.{figure}", {})[name] = round(statistics.median(values), 3)
    print(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
