"""Peak memory of `ledger import` for a file of N rows (issue 40, point 5), on SQLite or PostgreSQL.

Writes a JSONL file of N realistic rows (run, ticker, tags, model, times, tokens), migrates a fresh
ledger, then runs the real `ledger import` in a child process under `/usr/bin/time -v` and reports its
maximum resident set size, the file's size, the ratio, and the wall time. Median of --repeat runs,
each into a fresh ledger.

    PYTHONPATH=$PWD .venv/bin/python bench/import_memory.py [--rows 150000] [--repeat 3] [--pg URL]

Compare two trees by pointing PYTHONPATH at each (e.g. a worktree of main for the before figure).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
from sqlalchemy.engine import make_url

LEDGER = [sys.executable, "-m", "usage_ledger.cli"]
_T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def write_file(path: Path, rows: int) -> int:
    """N rows of 100 tickers × 17 calls per run (the workload of DESIGN §7); returns the file's bytes."""
    with path.open("wb") as out:
        for i in range(rows):
            start = _T0 + timedelta(seconds=i * 2)
            row = {
                "started_at": start.isoformat(),
                "elapsed_s": 40.5 + i % 17,
                "input_tokens": 10_800 + i % 977,
                "output_tokens": 1_470 + i % 313,
                "run": f"nightly-{i // 1700}",
                "ticker": f"T{i % 100:03d}",
                "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
                "ttft_s": 0.8 + (i % 7) / 10,
                "tags": {"stage": f"s{i % 17}", "host": "gpu-5090"},
                "finish_reason": "stop" if i % 23 else "length",
            }
            out.write(msgspec.json.encode(row) + b"\n")
    return path.stat().st_size


def _pg_database(admin_url: str) -> str:
    """A fresh database on the server of `admin_url` (left for inspection; bench databases are small)."""
    name = f"import_bench_{uuid.uuid4().hex[:10]}"
    parsed = make_url(admin_url)
    subprocess.run(
        [
            "psql",
            "-h",
            parsed.host or "127.0.0.1",
            "-U",
            parsed.username or "postgres",
            "-c",
            f'CREATE DATABASE "{name}"',
        ],
        check=True,
        capture_output=True,
    )
    return parsed.set(database=name).render_as_string(hide_password=False)


def run_once(path: Path, db_url: str) -> tuple[int, float]:
    """(peak RSS in bytes, wall seconds) of `ledger import` into a freshly migrated `db_url`."""
    # run from the file's directory: `python -m` puts the working directory before PYTHONPATH
    subprocess.run([*LEDGER, "db", "upgrade", "--db", db_url], check=True, capture_output=True, cwd=path.parent)
    done = subprocess.run(
        ["/usr/bin/time", "-v", *LEDGER, "import", str(path), "--db", db_url],
        capture_output=True,
        text=True,
        env={**os.environ, "LEDGER_LOG_FORMAT": "json"},
        cwd=path.parent,
    )
    if done.returncode != 0:
        raise SystemExit(f"ledger import failed ({done.returncode}): {done.stderr[-2000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    assert wall is not None
    seconds = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
    return rss_kb * 1024, seconds


def _tree() -> str:
    """Where the child's `usage_ledger` comes from (the tree measured)."""
    found = subprocess.run(
        [sys.executable, "-c", "import usage_ledger; print(usage_ledger.__file__)"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    return found.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=150_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg", help="a PostgreSQL URL where the user may CREATE DATABASE (default: SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calls.jsonl"
        size = write_file(path, args.rows)
        peaks, walls = [], []
        for i in range(args.repeat):
            db_url = _pg_database(args.pg) if args.pg else f"sqlite:///{Path(tmp) / f'ledger-{i}.db'}"
            peak, wall = run_once(path, db_url)
            peaks.append(peak)
            walls.append(wall)
            print(f"run {i + 1} ({_tree()}): peak RSS {peak / 2**20:,.0f} MiB, {wall:,.1f} s", file=sys.stderr)
    median_peak = statistics.median(peaks)
    backend = "PostgreSQL" if args.pg else "SQLite"
    print("| backend | rows | file | peak RSS (median) | RSS / file | wall (median) |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {backend} | {args.rows:,} | {size / 2**20:,.1f} MiB | {median_peak / 2**20:,.0f} MiB | "
        f"{median_peak / size:,.1f}× | {statistics.median(walls):,.1f} s |"
    )


if __name__ == "__main__":
    main()
