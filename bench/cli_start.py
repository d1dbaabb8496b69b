"""The `ledger` command's start-up: wall and CPU time of `ledger --help` and `ledger CMD --help`, N runs each.

    flock /tmp/box.lock .venv/bin/python bench/cli_start.py --runs 15 [--other PATH]

Each run is a fresh `ledger` process (the console script of this environment) importing the checkout on
PYTHONPATH; `--other PATH` times a second checkout in the same rounds, interleaved (e.g. `git archive BASE
usage_ledger | tar -x -C /tmp/base` for the code before a change). Prints the medians and ranges.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEDGER = str(Path(sys.executable).parent / "ledger")
COMMANDS = (["--help"], ["report", "--help"], ["serve", "--help"], ["verify", "--help"])


def _one(checkout: str, args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one `ledger ARGS` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([LEDGER, *args], env={**os.environ, "PYTHONPATH": checkout}, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--other", metavar="PATH", help="another checkout, timed in the same rounds")
    opts = parser.parse_args()
    checkouts = {"this": str(ROOT), **({"other": opts.other} if opts.other else {})}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(opts.runs):
        for name, path in checkouts.items():
            for args in COMMANDS:
                times.setdefault((name, " ".join(args)), []).append(_one(path, args))
    for (name, command), runs in times.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"{name:5} ledger {command:15} wall {statistics.median(walls):.3f} s [{min(walls):.3f}–{max(walls):.3f}]"
            f"  CPU {statistics.median(cpus):.3f} s [{min(cpus):.3f}–{max(cpus):.3f}]"
        )


if __name__ == "__main__":
    main()
