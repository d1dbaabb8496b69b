"""`ledger compare`: every figure checked against its own computation from the recorded events and numpy.

The ledger is recorded by `ledger serve` in front of the emulator (both backends); the seed runs
(imported, DESIGN §7) show a comparison of runs without chunk times.
"""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import subprocess
from datetime import datetime
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests._polling import wait_until
from tests.gateway import processes
from tests.gateway.processes import LEDGER, Process
from tests.projections.helpers import finished, started
from tests.projections.seed import DENSE, MOE, seed_rows, write_jsonl
from usage_ledger.answers.compare import Comparison, compare_runs, render_comparison
from usage_ledger.answers.compare_latency import Latency, Sample
from usage_ledger.imports.importer import import_file
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, blob_hash, read_blob, redact_blob
from usage_ledger.ledger.chunk_gaps import decode_chunk_gaps, encode_chunk_gaps
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import BlobRedacted, CallFinished, CallStarted, NewEvent, ServerSampled, new_event
from usage_ledger.ledger.read import iter_events
from usage_ledger.projections.errors import NotFound

EMULATOR_SPEED = 2  # the shared `emulator` fixture (tests/conftest.py)

MODEL = "emulator-moe"
PERCENTILES = (50, 90, 99)


@given(
    st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False) | st.integers(0, 50), min_size=1, max_size=300),
    st.floats(min_value=0, max_value=100),
)
def test_percentiles_are_numpys_linear_ones(values: list[float], p: float) -> None:
    sample = Sample.of(values)
    assert sample.percentile(p) == float(np.percentile(np.array(values, dtype=float), p))
    for q in PERCENTILES:
        assert sample.percentile(q) == float(np.percentile(np.array(values, dtype=float), q))
    assert sample.mean() == pytest.approx(float(np.mean(values)), rel=1e-12, abs=1e-12)


def test_an_empty_sample_has_no_percentile() -> None:
    assert Sample.of([]).percentile(50) is None and Sample.of([]).mean() is None


# -- a ledger recorded through the gateway --------------------------------------------------------------------------


RUNS = {  # run: (calls, concurrency, max_tokens, temperature)
    "alpha": (8, 4, 40, 0.8),
    "beta": (6, 2, 30, 0.6),
    "gamma": (3, 3, 20, 0.8),
}


async def _run_ended(db_url: str, run: str) -> bool:
    """Whether the gateway took `run`'s closing server sample (once none of its calls was in flight for a while)."""
    database = open_database(db_url, null_pool=True)
    try:
        bodies = [stored.body() async for stored in iter_events(database)]
    finally:
        await database.dispose()
    return any(isinstance(b, ServerSampled) and b.trigger == "run_end" and b.run == run for b in bodies)


async def _record(url: str, db_url: str) -> None:
    """Each run's calls (every fourth not streamed), `concurrency` at a time, two calls per ticker; the next run
    starts once the last one has its closing server sample."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for run, (count, concurrency, max_tokens, temperature) in RUNS.items():
            gate = asyncio.Semaphore(concurrency)

            async def one(
                i: int,
                run: str = run,
                max_tokens: int = max_tokens,
                temperature: float = temperature,
                gate: asyncio.Semaphore = gate,
            ) -> None:
                stream = i % 4 != 3
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"ticker {i // 2}: the quarter, {run}"}],
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    "stream": stream,
                    **({"stream_options": {"include_usage": True}} if stream else {}),
                }
                headers = {"x-ledger-run": run, "x-ledger-ticker": f"T{i // 2}"}
                async with gate:
                    reply = await http.post("/v1/chat/completions", json=body, headers=headers)
                    assert reply.status_code == 200
                    await reply.aread()

            await asyncio.gather(*(one(i) for i in range(count)))
            await wait_until(functools.partial(_run_ended, db_url, run), every_s=0.1, what=f"{run}'s closing sample")


class Call:
    def __init__(self, started: CallStarted, finished: CallFinished, gaps: list[int]) -> None:
        self.run = started.run
        self.ticker = started.tags.get("ticker")
        self.start = started.received_at
        timings = finished.timings
        assert timings.finished is not None and finished.usage is not None
        self.end = timings.finished
        self.first = timings.first_token
        self.last = timings.last_token
        self.input = finished.usage.prompt_tokens
        self.output = finished.usage.completion_tokens
        self.gaps = gaps


async def _recorded(database: Database) -> dict[str, list[Call]]:
    """Every call as recorded, with the gaps of the blob its `call.finished` names (none: no blob)."""
    started: dict[str, CallStarted] = {}
    runs: dict[str, list[Call]] = {}
    async for stored in iter_events(database):
        body = stored.body()
        if isinstance(body, CallStarted):
            started[body.call_id] = body
        elif isinstance(body, CallFinished):
            gaps: list[int] = []
            if body.chunk_gaps_blob is not None:
                async with database.engine.connect() as conn:
                    gaps = decode_chunk_gaps(await read_blob(conn, body.chunk_gaps_blob))
            call = Call(started[body.call_id], body, gaps)
            assert call.run is not None
            runs.setdefault(call.run, []).append(call)
    return runs


def _s(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def _check_latency(got: Latency | None, values_ms: list[float]) -> None:
    assert got is not None and got.n == len(values_ms)
    for p, figure in zip(PERCENTILES, (got.p50, got.p90, got.p99), strict=True):
        assert figure == pytest.approx(float(np.percentile(values_ms, p)), rel=1e-9, abs=1e-9)
    assert got.mean == pytest.approx(float(np.mean(values_ms)), rel=1e-9)


def _in_flight_max(calls: list[Call]) -> int:
    return max(sum(1 for o in calls if o.start <= c.start < o.end) for c in calls)


def _check_run(column: object, calls: list[Call]) -> dict[str, float]:
    from usage_ledger.answers.compare import RunComparison

    assert isinstance(column, RunComparison)
    wall = _s(max(c.end for c in calls), min(c.start for c in calls))
    out = sum(c.output for c in calls)
    assert (column.calls, column.tickers) == (len(calls), len({c.ticker for c in calls}))
    assert (column.input_tokens, column.output_tokens) == (sum(c.input for c in calls), out)
    assert column.wall_s == pytest.approx(wall, abs=1e-6)
    assert column.throughput_tps["batch_aggregate"] == pytest.approx(out / wall, rel=1e-6)
    per_call = statistics.mean(c.output / _s(c.end, c.start) for c in calls)
    assert column.throughput_tps["per_call_mean"] == pytest.approx(per_call, rel=1e-6)
    assert column.hours_per_100_tickers == pytest.approx(wall / 3600 * 100 / column.tickers, rel=1e-6)
    assert column.in_flight_mean == pytest.approx(sum(_s(c.end, c.start) for c in calls) / wall, rel=1e-6)
    assert column.in_flight_max == _in_flight_max(calls)
    streamed = [c for c in calls if c.first is not None and c.last is not None]
    ttft = [_s(c.first, c.start) * 1000 for c in streamed if c.first]
    e2e = [_s(c.last or c.end, c.start) * 1000 for c in calls]
    tpot = [(_s(c.last, c.start) - _s(c.first, c.start)) * 1000 / (c.output - 1) for c in streamed if c.output > 1]  # type: ignore[arg-type]
    itl = [g / 1000 for c in calls for g in c.gaps]
    assert len(itl) > 0 and column.itl_calls == len(streamed) and column.ok_calls == len(calls)
    _check_latency(column.ttft_ms, ttft)
    _check_latency(column.tpot_ms, tpot)
    _check_latency(column.e2e_ms, e2e)
    _check_latency(column.itl_ms, itl)
    # vLLM's identity: each call's gaps add up to its decode interval (e2e - TTFT)
    for c in streamed:
        assert sum(c.gaps) == round(_s(c.last, c.first) * 1_000_000)  # type: ignore[arg-type]
    return {
        "output_tokens": out,
        "wall_s": wall,
        "itl_ms.mean": float(np.mean(itl)),
        "itl_ms.p99": float(np.percentile(itl, 99)),
    }


async def _comparison(database: Database, runs: list[str]) -> Comparison:
    """The comparison once every run's closing server sample is in."""
    for _ in range(50):
        comparison = await compare_runs(database, runs)
        if all(r.server is not None and r.server.window_end is not None for r in comparison.runs):
            return comparison
        await asyncio.sleep(0.3)
    return comparison


async def test_runs_recorded_through_the_gateway(emulator: Process, backend_url: str, tmp_path: Path) -> None:
    processes.upgrade(backend_url)
    gateway = processes.gateway(tmp_path, emulator.url, backend_url, env={"LEDGER_SERVER_SAMPLE_S": "1"})  # type: ignore[attr-defined]
    gateway.start()
    try:
        await _record(gateway.url, backend_url)  # type: ignore[attr-defined]
    finally:
        gateway.stop()
    database = open_database(backend_url, null_pool=True)
    try:
        recorded = await _recorded(database)
        comparison = await _comparison(database, ["alpha", "beta", "gamma"])
        with pytest.raises(NotFound):
            await compare_runs(database, ["alpha", "nope"])
    finally:
        await database.dispose()
    assert [r.run for r in comparison.runs] == ["alpha", "beta", "gamma"]
    expected = {r.run: _check_run(r, recorded[r.run]) for r in comparison.runs}
    for ratio in comparison.ratios:
        assert ratio.against == "alpha"
        for name in ("output_tokens", "wall_s", "itl_ms.mean"):
            value = expected[ratio.run][name]
            assert ratio.values[name] == pytest.approx(value / expected["alpha"][name], rel=1e-6), name
    alpha, beta, gamma = comparison.runs
    assert alpha.server is not None and alpha.server.config is not None
    assert alpha.server.config["cache_dtype"] == "fp8"  # the emulator's moe profile
    assert alpha.differences == [] and any(d.startswith("temperature:") for d in beta.differences)
    assert not any(d.startswith("temperature:") for d in gamma.differences)

    as_json = json.loads(render_comparison(comparison, "json"))
    assert set(as_json) == {"runs", "ratios"} and len(as_json["ratios"]) == 2
    assert as_json["runs"][1]["itl_ms"]["p99"] == pytest.approx(expected["beta"]["itl_ms.p99"])
    table = render_comparison(comparison, "table")
    grid = [line for line in table.splitlines() if line.startswith(("┃", "│", "┏", "┡", "└"))]
    assert grid and max(len(line) for line in grid) <= 100
    assert "ITL p99" in table and "B÷A" in table and "C÷A" in table and "B differs from A: temperature" in table


# -- gap blobs: shared, redacted, missing ---------------------------------------------------------------------------


def _with_gaps(event: NewEvent, digest: str) -> NewEvent:
    assert isinstance(event.body, CallFinished)
    return msgspec.structs.replace(event, body=msgspec.structs.replace(event.body, chunk_gaps_blob=digest))


async def test_itl_reads_the_gap_blobs_and_a_missing_or_redacted_one_counts_as_none(database: Database) -> None:
    compressor = BlobCompressor()
    shared, redacted, other = ([1_000, 2_000, 3_000], [500, 500], [4_000])
    blobs = [compressor.prepare(encode_chunk_gaps(gaps)) for gaps in (shared, redacted, other)]
    assert all(b is not None for b in blobs)
    shared_hash, redacted_hash, other_hash = (b.hash for b in blobs if b is not None)
    never_stored = blob_hash(encode_chunk_gaps([9_000_000]))
    named = {"a1": shared_hash, "a2": redacted_hash, "a3": never_stored, "a4": shared_hash, "b1": other_hash}
    events = []
    for i, (call_id, digest) in enumerate(named.items()):
        run = call_id[0]
        events += [started(call_id, i, run=run), _with_gaps(finished(call_id, i, i + 5), digest)]
    await append_events(database, events, [b for b in blobs if b is not None])
    redaction = new_event(BlobRedacted(blob_hash=redacted_hash, reason="test"), stream=f"blob-{redacted_hash}")
    await append_events(database, [redaction])
    async with database.engine.begin() as conn:
        assert await redact_blob(conn, redacted_hash)
    a, b = (await compare_runs(database, ["a", "b"])).runs
    assert (a.ok_calls, a.itl_calls) == (4, 2)  # a1 and a4 share one blob; a2's is redacted, a3's never stored
    _check_latency(a.itl_ms, [g / 1000 for g in shared + shared])
    assert (b.itl_calls, b.itl_ms and b.itl_ms.n) == (1, 1)


async def test_without_refresh_it_reads_the_projections_as_they_are(database: Database) -> None:
    """What the dashboard under `ledger serve` asks for: the follower (another process) catches up, not the page."""
    await append_events(database, [started("a1", 0, run="a"), finished("a1", 0, 5)])
    await append_events(database, [started("b1", 10, run="b"), finished("b1", 10, 15)])
    await compare_runs(database, ["a", "b"])  # catches up
    await append_events(database, [started("c1", 20, run="c"), finished("c1", 20, 25)])
    with pytest.raises(NotFound):
        await compare_runs(database, ["a", "c"], refresh=False)  # run c is not in the read model yet
    assert [r.run for r in (await compare_runs(database, ["a", "c"])).runs] == ["a", "c"]


# -- imported runs: no chunk times, the user's own numbers ---------------------------------------------------------


async def test_the_seed_runs_side_by_side(database: Database, tmp_path: Path) -> None:
    await import_file(database, write_jsonl(tmp_path / "seed.jsonl", seed_rows(MOE) + seed_rows(DENSE)))
    comparison = await compare_runs(database, [MOE.run, DENSE.run])
    moe, dense = comparison.runs
    assert round(moe.throughput_tps["batch_aggregate"] or 0) == 911
    assert round(dense.throughput_tps["batch_aggregate"] or 0) == 118
    (ratio,) = comparison.ratios
    expected = (DENSE.output_tokens / DENSE.wall_s) / (MOE.output_tokens / MOE.wall_s)
    assert ratio.values["throughput_tps.batch_aggregate"] == pytest.approx(expected, rel=1e-6)
    # the seed's calls run in lanes, back to back: exactly `concurrency` in flight all along
    assert (moe.in_flight_max, dense.in_flight_max) == (MOE.concurrency, DENSE.concurrency)
    assert moe.in_flight_mean == pytest.approx(MOE.concurrency, rel=1e-6)
    assert moe.ttft_ms is not None and moe.ttft_ms.p99 == pytest.approx(1500)  # every imported call: 1.5 s
    assert moe.itl_ms is None and moe.itl_calls == 0 and moe.server is None
    durations = sorted(
        _s(datetime.fromisoformat(str(r["finished_at"])), datetime.fromisoformat(str(r["started_at"])))
        for r in seed_rows(DENSE)
    )
    assert dense.e2e_ms is not None and dense.e2e_ms.p90 == pytest.approx(float(np.percentile(durations, 90)) * 1000)
    assert "none recorded" in render_comparison(comparison, "table")


def test_the_command(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db)
    path = write_jsonl(tmp_path / "seed.jsonl", seed_rows(MOE) + seed_rows(DENSE))
    subprocess.run([LEDGER, "import", str(path), "--db", db], check=True, capture_output=True, timeout=120)

    def compare(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([LEDGER, "compare", *args, "--db", db], capture_output=True, text=True, timeout=120)

    shown = compare(MOE.run, DENSE.run, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    runs = json.loads(shown.stdout)["runs"]
    assert [r["run"] for r in runs] == [MOE.run, DENSE.run]
    table = compare(MOE.run, DENSE.run)
    assert table.returncode == 0 and "tok/s batch_aggregate" in table.stdout
    assert compare(MOE.run).returncode == 2  # one run is no comparison
    missing = compare(MOE.run, "nope")
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr
