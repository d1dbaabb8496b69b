"""`ledger demo` as a user runs it, scaled down; and the README's set-up commands, literally."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from rich.cells import cell_len

from tests.ledger.helpers import build_ledger
from tests.projections.helpers import finished, started
from usage_ledger.answers.reports import runs_report, tickers_report
from usage_ledger.demo import DemoOptions, demo_plan, repeat_plan
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.projections.rows import RunRow, TickerRow

ROOT = Path(__file__).resolve().parent.parent


def _reports(db_file: Path, formula: str = "batch_aggregate") -> tuple[list[RunRow], list[TickerRow], int]:
    async def read() -> tuple[list[RunRow], list[TickerRow], int]:
        database = open_database(f"sqlite:///{db_file}", null_pool=True)
        try:
            runs = await runs_report(database, formula=formula)
            tickers = await tickers_report(database)
            assert (await verify_chain(database)).ok
            calls = [e async for e in iter_events(database) if e.type.startswith("call.")]
            return runs, tickers, len(calls)
        finally:
            await database.dispose()

    return asyncio.run(read())


def _earlier_ledger(db_file: Path) -> None:
    """A ledger the user already explored: one run of one call, which the demo must keep."""

    events = [started("e1", 0, run="earlier", model="m"), finished("e1", 0, 10)]
    asyncio.run(build_ledger(f"sqlite:///{db_file}", lambda database: append_events(database, events)))


# MoE ÷ dense in the seed (DESIGN §7): 911 ÷ 118 aggregate; per call 911/14 ÷ 118/3 (README).
SEED_AGGREGATE_RATIO = 911 / 118
SEED_PER_CALL_RATIO = (911 / 14) / (118 / 3)


def test_one_clock_speed_and_the_dense_box_gets_its_share_in_whole_rounds() -> None:
    speed, (moe, dense) = demo_plan(DemoOptions(db_path=Path("x.db")))
    assert (moe.profile.name, moe.tickers, dense.profile.name, dense.tickers) == ("moe", 100, "dense", 12)
    assert speed == pytest.approx(2741 / 90)  # the seed's MoE batch (46 min) in 90 s
    # 12 dense tickers (4 rounds of 3) take as long as the 100 MoE ones: 12 × 22680 ≈ 100 × 2741
    assert pytest.approx(1, abs=0.01) == 12 * 22680 / (100 * 2741)
    assert [b.tickers for b in demo_plan(DemoOptions(db_path=Path("x.db"), tickers=14, steps=3))[1]] == [14, 3]
    assert [b.tickers for b in demo_plan(DemoOptions(db_path=Path("x.db"), tickers=1, steps=1))[1]] == [1, 1]


def test_the_repetition_takes_about_a_third_of_each_box_in_whole_rounds() -> None:
    """28 MoE tickers (2 rounds of 14) and 3 dense ones (1 round of 3): ≈ a third of the first batch's time."""
    _, boxes = demo_plan(DemoOptions(db_path=Path("x.db")))
    assert [(b.profile.name, b.tickers) for b in repeat_plan(boxes)] == [("moe", 28), ("dense", 3)]
    _, small = demo_plan(DemoOptions(db_path=Path("x.db"), tickers=14, steps=3))
    assert [b.tickers for b in repeat_plan(small)] == [14, 3]  # at least one round, never more than the box ran


@pytest.mark.slow
def test_demo_adds_runs_holding_the_seeds_picture(tmp_path: Path) -> None:
    """14 tickers × 3 calls on MoE, 3 × 3 on dense (its share), into a ledger that already has a run; each
    box once more with another seed (here on all its tickers: one round), and the decision at the end.

    The ratio's tolerance comes from the emulator's timing model: run closed-loop in pure emulated
    time (`emulator.simulate`'s scheduler) with this shape, MoE ÷ dense is 7.0-8.3× aggregate and
    1.71-1.79× per call over output-length draws (the lengths vary ±50 % per call, so a 3-call
    worker's batch ends 17 % early or late, and a batch ends with its slowest worker); the full
    100-ticker demo gives 7.68× and 1.70×. The clocks run at ≈3.4× real time here, so the real-time
    work between a worker's calls (client and gateway: tens of ms, a few hundred on a busy machine)
    costs MoE's 22 s calls and dense's 40 s ones at most a few per cent; at 7× on a machine with a
    load of 11 on 2 cores MoE ÷ dense fell to 6.3×.
    """
    db_file = tmp_path / "demo.db"
    _earlier_ledger(db_file)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "usage_ledger.cli",
            "demo",
            "--tickers",
            "14",
            "--steps",
            "3",
            "--seconds",
            "20",
            "--db-file",
            str(db_file),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},  # as from a pipe
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "chain intact" in result.stdout
    assert f"added to the existing {db_file.name} (1 run in it already; nothing is deleted)" in result.stdout
    lines = result.stdout.splitlines()
    # every line fits 100 columns but what cannot be broken, printed whole on a line of its own: a URL (a wrapped one
    # would not open), or one option of a command to copy with its value (a long --db path)
    unbreakable = r" *http://\S+| *--\S+ \S+( \\)?"
    wide = [line for line in lines if cell_len(line) > 100 and not re.fullmatch(unbreakable, line)]
    assert wide == []
    runs, tickers, events = _reports(db_file)
    # the earlier call, then each demo call's started + finished (the batches, then their repetitions)
    assert events == 2 + 2 * 2 * (14 * 3 + 3 * 3)
    by_profile = {row.run.split("-")[0] + ("-again" if row.run.endswith("-seed2") else ""): row for row in runs}
    assert set(by_profile) == {"earlier", "moe", "dense", "moe-again", "dense-again"}
    assert by_profile["earlier"].calls == 1  # kept
    for name, ticker_count in (("moe", 14), ("dense", 3)):
        row, again = by_profile[name], by_profile[f"{name}-again"]
        assert re.fullmatch(rf"{name}-\d{{8}}-\d{{6}}", row.run)  # to the second: two demos never merge
        assert again.run == f"{row.run}-seed2" and (again.calls, again.failed_calls) == (ticker_count * 3, 0)
        assert (row.calls, row.failed_calls, row.tickers) == (ticker_count * 3, 0, ticker_count)
        assert row.calls_per_ticker.min == row.calls_per_ticker.max == 3
        assert row.input_tokens > row.calls * 10_000  # ≈10.8k-token prompts
        assert row.server is not None and row.server.reconciled is True, row.server  # the emulator's counters agree
    moe, dense = by_profile["moe"], by_profile["dense"]
    assert moe.throughput_tps is not None and dense.throughput_tps is not None
    aggregate = moe.throughput_tps / dense.throughput_tps
    assert 0.85 * SEED_AGGREGATE_RATIO <= aggregate <= 1.15 * SEED_AGGREGATE_RATIO, aggregate
    per_call_rows = {row.run: row.throughput_tps for row in _reports(db_file, "per_call_mean")[0]}
    per_call_moe, per_call_dense = per_call_rows[moe.run], per_call_rows[dense.run]
    assert per_call_moe is not None and per_call_dense is not None
    per_call = per_call_moe / per_call_dense
    assert 0.85 * SEED_PER_CALL_RATIO <= per_call <= 1.15 * SEED_PER_CALL_RATIO, per_call
    assert per_call < aggregate / 3  # the trap: averaging per call hides most of the difference
    assert len([t for t in tickers if t.run in (moe.run, dense.run)]) == 14 + 3
    _check_decision(result.stdout, db_file, moe.run, dense.run)
    eras = result.stdout[result.stdout.index("Eras by model") : result.stdout.index("labels of run")]
    for run in (moe, dense):
        again = by_profile[f"{run.run.split('-')[0]}-again"]
        assert run.throughput_tps is not None and again.throughput_tps is not None
        # one era per model: the mean aggregate throughput of its batch and repetition, as the runs table has them
        era = next(line for line in eras.splitlines() if line.split()[:1] == [run.model])
        assert f"{(run.throughput_tps + again.throughput_tps) / 2:,.0f}" in era.split(), era
        for row in (run, again):  # the runs table names each run in full, on the line of its throughput
            assert any(row.run in line and f"{row.throughput_tps:,.0f}" in line for line in lines)
    story = next(line for line in lines if line.lstrip().startswith("aggregate t/s"))
    assert f"{aggregate:.1f}×" in story and "911 ÷ 118 = 7.7×" in story


def _check_decision(stdout: str, db_file: Path, moe: str, dense: str) -> None:
    """The demo ends with `ledger decide` over both boxes, each with self-agreement, and says what is synthetic."""
    decision = stdout[stdout.index("The decision") :]
    assert "ledger decide" in decision and "/_ledger/ui/decide?a=" in decision
    assert "The grades and returns are synthetic." in " ".join(decision.split())
    assert "figure [low, high]: 95 % interval" in decision and "n (a | b): throughput_tps 2 | 2 runs" in decision
    scale = "Strong Sell,Sell,Hold,Buy,Strong Buy"
    a, b = [moe, f"{moe}-seed2"], [dense, f"{dense}-seed2"]
    command = ["decide", "--a", *a, "--b", *b, "--scale", scale, "--format", "json", "--db", f"sqlite:///{db_file}"]
    report = subprocess.run(
        [sys.executable, "-m", "usage_ledger.cli", *command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    figures = msgspec.json.decode(report.stdout)
    for group, runs in (("a", a), ("b", b)):
        got = figures[group]
        assert got["runs"] == runs
        # self-agreement: the rate is there for both boxes; kappa too unless every grade was one label
        assert got["self_agree_rate"] is not None and 0 <= got["self_agree_rate"] <= 1, got
        assert got["self_qwk"] is not None or any(item.startswith("QWK") for item in figures["unmeasured"]), figures
        # the synthetic returns cover every ticker: rank IC is there unless a run gave one label to every key
        assert got["rank_ic"] is not None or any(item.startswith("rank IC") for item in figures["unmeasured"])
        shares = got["label_shares"]
        assert set(shares) == set(scale.split(",")) and max(shares, key=shares.get) == "Hold"  # Hold-heavy
    assert not any("no returns" in item or "one run only" in item for item in figures["unmeasured"])
    for group in ("a", "b"):  # every figure says what it rests on: two runs, the tickers graded
        evidence = figures[group]["evidence"]
        assert evidence["throughput_tps"]["n"] == 2 and evidence["rank_ic"]["n"] > 2, evidence
        assert all(item["ci95"] is not None or item["reason"] for item in evidence.values()), evidence


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_readme_setup_commands_work_in_a_fresh_environment(tmp_path: Path) -> None:
    """`make demo` as the README says, in a new virtual environment (scaled down via DEMO_ARGS).

    The clocks run fast (`--seconds 0.5`: ≈13× real time, so a dense call takes ≈2.5 s, not ≈11 s at
    `--seconds 2`): this test asserts what the set-up gives, not the ratios, which the test above holds
    at ≈3.4×."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(make \w+)\s+#", readme, flags=re.MULTILINE)
    assert commands == ["make demo", "make test"]
    venv = tmp_path / "venv"
    db_file = tmp_path / "readme-demo.db"
    demo = subprocess.run(
        ["make", "demo", f"VENV={venv}", f"DEMO_ARGS=--tickers 2 --steps 2 --seconds 0.5 --db-file {db_file}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert (venv / "bin" / "ledger").exists()
    assert "installing usage-ledger and its runtime dependencies" in demo.stdout  # said, not silent
    for tool in ("pytest", "mypy", "ruff", "playwright"):  # the demo needs the product, not the toolchain
        assert not (venv / "bin" / tool).exists(), tool
    assert "chain intact" in demo.stdout and "The grades and returns are synthetic." in " ".join(demo.stdout.split())
    runs, _, _ = _reports(db_file)
    assert len(runs) == 4  # each box's batch and its repetition
