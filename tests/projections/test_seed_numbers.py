"""The user's own numbers (DESIGN §7): 911 t/s and 118 t/s, 17 calls per ticker, Seoul vs UTC days."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.projections.seed import DENSE, MOE, SEOUL, seed_rows, write_jsonl
from usage_ledger.answers.reports import daily_report, runs_report, tickers_report
from usage_ledger.imports.importer import import_file
from usage_ledger.ledger.db import Database


async def _load(database: Database, tmp_path: Path) -> None:
    rows = seed_rows(MOE) + seed_rows(DENSE)
    result = await import_file(database, write_jsonl(tmp_path / "seed.jsonl", rows))
    assert result.appended == 3400 and result.invalid == 0


async def test_seed_runs_report_user_numbers(database: Database, tmp_path: Path) -> None:
    await _load(database, tmp_path)
    rows = {r.run: r for r in await runs_report(database)}
    moe, dense = rows[MOE.run], rows[DENSE.run]
    assert round(moe.throughput_tps or 0) == 911
    assert round(dense.throughput_tps or 0) == 118
    assert (moe.input_tokens, moe.output_tokens) == (18_315_222, 2_497_437)
    assert (dense.input_tokens, dense.output_tokens) == (18_982_363, 2_680_713)
    for row in (moe, dense):
        assert row.calls == 1700 and row.tickers == 100 and row.failed_calls == 0 and row.incomplete_calls == 0
        assert row.calls_per_ticker is not None
        assert (row.calls_per_ticker.min, row.calls_per_ticker.median, row.calls_per_ticker.max) == (17, 17.0, 17)
        assert row.formula == "batch_aggregate"
    assert moe.wall_s is not None and abs(moe.wall_s - 2741) < 0.01
    assert dense.wall_s is not None and abs(dense.wall_s - 22680) < 0.01
    assert dense.hours_per_100_tickers is not None and abs(dense.hours_per_100_tickers - 6.3) < 0.001
    assert moe.model == MOE.model

    per_call = {r.run: r for r in await runs_report(database, formula="per_call_mean")}
    assert per_call[MOE.run].formula == "per_call_mean"
    # per-call speeds ignore batching: far below the aggregate (14 resp. 3 calls in flight)
    assert per_call[MOE.run].throughput_tps is not None and per_call[MOE.run].throughput_tps < 911 / 5
    assert round(per_call[DENSE.run].throughput_tps or 0) != 118


async def test_seed_tickers_17_calls_each(database: Database, tmp_path: Path) -> None:
    await _load(database, tmp_path)
    rows = await tickers_report(database, run=MOE.run)
    assert len(rows) == 100
    assert {r.calls for r in rows} == {17}
    assert sum(r.output_tokens for r in rows) == 2_497_437


async def test_seed_daily_split_seoul_vs_utc(database: Database, tmp_path: Path) -> None:
    await _load(database, tmp_path)
    rows = seed_rows(MOE) + seed_rows(DENSE)
    midnight = datetime(2026, 3, 3, tzinfo=SEOUL)
    before = [r for r in rows if datetime.fromisoformat(str(r["started_at"])) < midnight]
    assert 0 < len(before) < 1700  # the MoE run straddles midnight in Seoul

    utc = await daily_report(database, tz="UTC")
    assert [(d.day, d.calls) for d in utc] == [("2026-03-02", 3400)]
    assert utc[0].output_tokens == 2_497_437 + 2_680_713

    seoul = await daily_report(database, tz="Asia/Seoul")
    assert [(d.day, d.calls) for d in seoul] == [("2026-03-02", len(before)), ("2026-03-03", 3400 - len(before))]
    assert seoul[0].output_tokens == sum(int(str(r["output_tokens"])) for r in before)
