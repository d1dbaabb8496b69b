"""A synthetic decision trace: three MoE and two dense repetitions of 99 tickers, Hold-heavy grades, returns.

Each run asks once per ticker; the answer (stored as the call's response body) ends with
`Grade: <label>`. A ticker has a "true" grade drawn Hold-heavy; each repetition keeps it with a
run-specific probability and otherwise draws again, so repetitions agree partly, as the seed's did.
Returns follow the true grade's position plus noise. Everything is seeded: the same trace every time.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

import msgspec

from tests.projections.helpers import finished, started
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor
from usage_ledger.ledger.db import Database

SCALE = ["Strong Sell", "Sell", "Hold", "Buy", "Strong Buy"]
WEIGHTS = [0.04, 0.08, 0.74, 0.10, 0.04]
TICKERS = [f"T{i:03d}" for i in range(99)]
MOE = ["moe-1", "moe-2", "moe-3"]
DENSE = ["dense-1", "dense-2"]
KEEP = {"moe-1": 0.55, "moe-2": 0.5, "moe-3": 0.6, "dense-1": 0.7, "dense-2": 0.65}
# (seconds between call starts, call length, output tokens per call)
SHAPE = {"moe": (5.0, 20.0, 1470), "dense": (40.0, 120.0, 1470)}
EXTRACT = r"Grade: ([A-Za-z ]+)\s*$"


def shape(run: str) -> tuple[float, float, int]:
    return SHAPE["moe" if run.startswith("moe") else "dense"]


def start_of(run: str) -> float:
    return 86_400.0 * (MOE + DENSE).index(run)


def build_labels() -> dict[str, dict[str, str]]:
    rng = random.Random(41)
    truth = {t: rng.choices(SCALE, WEIGHTS)[0] for t in TICKERS}
    labels: dict[str, dict[str, str]] = {}
    for run in MOE + DENSE:
        labels[run] = {t: truth[t] if rng.random() < KEEP[run] else rng.choices(SCALE, WEIGHTS)[0] for t in TICKERS}
    return labels


def build_returns() -> dict[str, float]:
    rng = random.Random(42)
    truth = build_labels()["moe-1"]
    return {t: round(0.01 * (SCALE.index(truth[t]) - 2) + rng.gauss(0, 0.03), 6) for t in TICKERS}


def answer(run: str, ticker: str, label: str) -> bytes:
    text = f"{ticker} under {run}: revenue grew, margins held.\nGrade: {label}"
    return msgspec.json.encode({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})


async def append_trace(database: Database, labels: dict[str, dict[str, str]]) -> None:
    """Every run's calls, one per ticker, with its answer stored."""
    compressor = BlobCompressor()
    for run in MOE + DENSE:
        gap, length, tokens = shape(run)
        events, blobs = [], []
        for i, ticker in enumerate(TICKERS):
            t0 = start_of(run) + gap * i
            call = f"{run}-{ticker}"
            blob = compressor.prepare(answer(run, ticker, labels[run][ticker]))
            assert blob is not None
            end = finished(call, t0, t0 + length, completion=tokens)
            end = msgspec.structs.replace(end, body=msgspec.structs.replace(end.body, response_blob=blob.hash))
            events += [started(call, t0, run=run, ticker=ticker, model=run.split("-")[0]), end]
            blobs.append(blob)
        await append_events(database, events, blobs)


def write_labels(path: Path, labels: dict[str, dict[str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "key", "label"])
        for run, by_key in labels.items():
            writer.writerows([run, key, label] for key, label in by_key.items())
    return path


def write_returns(path: Path, returns: dict[str, float], as_of: str = "") -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["key", "return", "as_of"])
        writer.writerows([key, repr(value), as_of] for key, value in returns.items())
    return path
