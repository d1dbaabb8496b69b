"""`ledger demo` as a user runs it, scaled down; and the README's set-up commands, literally."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.projections.reports import runs_report, tickers_report
from usage_ledger.projections.rows import RunRow, TickerRow

ROOT = Path(__file__).resolve().parent.parent


def _reports(db_file: Path) -> tuple[list[RunRow], list[TickerRow], int]:
    async def read() -> tuple[list[RunRow], list[TickerRow], int]:
        database = open_database(f"sqlite:///{db_file}", null_pool=True)
        try:
            runs = await runs_report(database)
            tickers = await tickers_report(database)
            assert (await verify_chain(database)).ok
            calls = [e async for e in iter_events(database) if e.type.startswith("call.")]
            return runs, tickers, len(calls)
        finally:
            await database.dispose()

    return asyncio.run(read())


@pytest.mark.slow
def test_demo_scaled_down_reports_what_it_sent(tmp_path: Path) -> None:
    db_file = tmp_path / "demo.db"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "usage_ledger.cli",
            "demo",
            "--tickers",
            "4",
            "--steps",
            "3",
            "--seconds",
            "3",
            "--db-file",
            str(db_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},  # as from a pipe: rich would assume 80
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "chain intact" in result.stdout
    runs, tickers, events = _reports(db_file)
    assert events == 2 * 4 * 3 * 2  # two runs × 12 calls × (started + finished); besides, server.sampled
    by_profile = {row.run.split("-")[0]: row for row in runs}
    assert set(by_profile) == {"moe", "dense"}
    for row in by_profile.values():
        assert (row.calls, row.failed_calls, row.tickers) == (12, 0, 4)
        assert row.calls_per_ticker.min == row.calls_per_ticker.max == 3
        assert row.input_tokens > 12 * 10_000  # ≈10.8k-token prompts
        assert row.output_tokens > 0 and row.throughput_tps is not None and row.throughput_tps > 0
        assert row.server is not None and row.server.reconciled is True, row.server  # the emulator's counters agree
    assert len(tickers) == 8
    eras = result.stdout[result.stdout.index("Eras by model") :]
    for run in by_profile.values():  # one era per model, its aggregate throughput as the runs table has it
        assert run.model is not None and run.model in eras and f"{run.throughput_tps:,.0f}" in eras
    for run in by_profile.values():  # the runs table names each run in full, on the line of its throughput
        assert run.throughput_tps is not None
        assert any(run.run in line and f"{run.throughput_tps:,.0f}" in line for line in result.stdout.splitlines())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_readme_setup_commands_work_in_a_fresh_environment(tmp_path: Path) -> None:
    """`make demo` as the README says, in a new virtual environment (scaled down via DEMO_ARGS)."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(make \w+)\s+#", readme, flags=re.MULTILINE)
    assert commands == ["make demo", "make test"]
    venv = tmp_path / "venv"
    db_file = tmp_path / "readme-demo.db"
    demo = subprocess.run(
        ["make", "demo", f"VENV={venv}", f"DEMO_ARGS=--tickers 2 --steps 2 --seconds 2 --db-file {db_file}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert (venv / "bin" / "ledger").exists()
    assert "chain intact" in demo.stdout
    runs, _, _ = _reports(db_file)
    assert len(runs) == 2
