"""Traces shaped like the user's seed runs (DESIGN §7): 100 tickers x 17 calls, exact token totals."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import msgspec

SEOUL = ZoneInfo("Asia/Seoul")
TICKERS = 100
CALLS_PER_TICKER = 17


@dataclass(frozen=True)
class SeedRun:
    run: str
    model: str
    input_tokens: int
    output_tokens: int
    wall_s: float
    concurrency: int
    start: datetime


MOE = SeedRun(
    "moe-2026-03-02", "qwen3-moe", 18_315_222, 2_497_437, 2741.0, 14, datetime(2026, 3, 2, 23, 40, tzinfo=SEOUL)
)
DENSE = SeedRun(
    "dense-2026-03-03",
    "gemma-27b",
    18_982_363,
    2_680_713,
    6 * 3600 + 18 * 60,
    3,
    datetime(2026, 3, 3, 1, 0, tzinfo=SEOUL),
)


def _split(total: int, n: int, spread: int) -> list[int]:
    """n non-negative parts summing exactly to total, varied by ±spread in pairs."""
    base, rem = divmod(total, n)
    parts = [base + (1 if i < rem else 0) for i in range(n)]
    for i in range(0, n - 1, 2):
        d = (i * 7919) % (spread + 1)
        parts[i] += d
        parts[i + 1] -= d
    return parts


def seed_rows(seed: SeedRun) -> list[dict[str, object]]:
    n = TICKERS * CALLS_PER_TICKER
    inputs = _split(seed.input_tokens, n, 3000)
    outputs = _split(seed.output_tokens, n, 600)
    lanes: list[list[int]] = [list(range(lane, n, seed.concurrency)) for lane in range(seed.concurrency)]
    rows: list[dict[str, object]] = []
    for lane in lanes:
        duration = seed.wall_s / len(lane)
        for slot, index in enumerate(lane):
            started = seed.start + timedelta(seconds=slot * duration)
            finished = seed.start + timedelta(seconds=(slot + 1) * duration)
            rows.append(
                {
                    "call_id": f"{seed.run}-{index:04d}",
                    "run": seed.run,
                    "ticker": f"T{index // CALLS_PER_TICKER:03d}",
                    "model": seed.model,
                    "started_at": started.isoformat(),
                    "finished_at": finished.isoformat(),
                    "input_tokens": inputs[index],
                    "output_tokens": outputs[index],
                    "ttft_s": 1.5,
                }
            )
    rows.sort(key=lambda r: str(r["call_id"]))
    return rows


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in rows))
    return path
