"""What a run costs (issue #53 point 7): `ledger annotate --price-per-hour P --currency C` on runs or a time range;
eras, compare and decide show cost per 100 tickers and per million output tokens; without a price, nothing."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.projections.helpers import T0, append, finished, started
from usage_ledger.cli import main
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.events import NewEvent
from usage_ledger.projections.cost import parse_price, run_cost


def batch(run: str, t0: float, tickers: int, *, length: float) -> list[NewEvent]:
    """One call per ticker, one after another, each `length` s and 100 output tokens."""
    out: list[NewEvent] = []
    for i in range(tickers):
        call, t = f"{run}-{i}", t0 + i * length
        out += [started(call, t, run=run, ticker=f"T{i}"), finished(call, t, t + length, completion=100)]
    return out


@pytest.fixture
def ledger_url(backend_url: str) -> str:
    """`fast` and `slow` (4 tickers in 1 h and in 4 h) and `free` (no price), on hardware a, b and a."""
    assert main(["db", "upgrade", "--db", backend_url]) == 0

    async def seed() -> None:
        database = open_database(backend_url, null_pool=True)
        try:
            await append(
                database,
                *batch("fast", 0, 4, length=900),
                *batch("slow", 10_000, 4, length=3600),
                *batch("free", 100_000, 4, length=900),
            )
        finally:
            await database.dispose()

    asyncio.run(seed())
    for run, hardware in (("fast", "a"), ("slow", "b"), ("free", "a2")):
        assert main(["annotate", "--run", run, "--hardware", hardware, "--db", backend_url]) == 0
    return backend_url


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    capsys.readouterr()
    assert main([*args, "--format", "json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def test_cost_per_100_tickers_and_per_million_tokens(ledger_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", ledger_url]
    assert main(["annotate", "--run", "fast", "--price-per-hour", "2", "--currency", "USD", *db]) == 0
    start, end = (T0 + timedelta(seconds=s) for s in (9_000, 50_000))  # holds `slow` only (T0 + 10,000 s)
    price = ["--price-per-hour", "1.5", "--currency", "USD"]
    assert main(["annotate", "--from", start.isoformat(), "--to", end.isoformat(), *price, *db]) == 0
    eras = {e["group"]: e for e in _json(capsys, "report", "eras", "--by", "hardware", *db)}  # type: ignore[union-attr]
    # fast: 1 h for 4 tickers = 25 h per 100 tickers × 2 = 50 USD; 2 USD for 400 tokens = 5,000 USD per M
    assert eras["a"]["cost"] == {
        "currency": "USD",
        "priced_runs": 1,
        "per_100_tickers": pytest.approx(50),
        "per_million_output_tokens": pytest.approx(5000),
    }
    # slow: 4 h → 100 h per 100 tickers × 1.5 = 150 USD; 6 USD for 400 tokens
    assert eras["b"]["cost"]["per_100_tickers"] == pytest.approx(150)
    assert eras["b"]["cost"]["per_million_output_tokens"] == pytest.approx(15_000)
    assert eras["a2"]["cost"] is None  # no price: nothing guessed
    compared = _json(capsys, "compare", "fast", "slow", "free", *db)
    columns = compared["runs"]  # type: ignore[index]
    assert [c["cost"] and c["cost"]["per_100_tickers"] for c in columns] == [
        pytest.approx(50),
        pytest.approx(150),
        None,
    ]
    assert compared["ratios"][0]["values"]["cost.per_100_tickers"] == pytest.approx(3)  # type: ignore[index]
    capsys.readouterr()
    assert main(["compare", "fast", "slow", *db]) == 0
    table = capsys.readouterr().out
    assert "per 100 tickers" in table and "cost in USD at 2 an hour" in table
    decision = _json(capsys, "decide", "--a", "fast", "--b", "slow", "free", "--scale", "Buy,Sell", *db)
    assert decision["a"]["cost"]["per_100_tickers"] == pytest.approx(50)  # type: ignore[index]
    assert decision["b"]["cost"]["priced_runs"] == 1  # type: ignore[index]  # `free` has no price


def test_without_a_price_nothing_is_shown(ledger_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", ledger_url]
    capsys.readouterr()
    assert main(["compare", "fast", "slow", *db]) == 0
    assert "per M output tokens" not in capsys.readouterr().out
    assert main(["decide", "--a", "fast", "--b", "slow", "--scale", "Buy,Sell", *db]) == 0
    assert "cost" not in capsys.readouterr().out
    rows = _json(capsys, "report", "runs", *db)
    assert [r["cost"] for r in rows] == [None, None, None]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "flags",
    [["--price-per-hour", "1.89"], ["--currency", "USD"], ["--price-per-hour", "-1", "--currency", "USD"],
     ["--price-per-hour", "nan", "--currency", "USD"], ["--price-per-hour", "1", "--currency", "U S"]],
)  # fmt: skip
def test_a_bad_price_is_refused(ledger_url: str, flags: list[str]) -> None:
    assert main(["annotate", "--run", "fast", *flags, "--db", ledger_url]) == 2


@given(st.text(max_size=12))
def test_a_price_is_a_positive_finite_number_or_nothing(text: str) -> None:
    price = parse_price(text)
    assert price is None or (price > 0 and price != float("inf"))
    cost = run_cost({"price_per_hour": text, "currency": "USD"}, 3600.0, 10.0, 1000)
    assert (cost is None) == (price is None)
    if cost is not None:
        assert cost.run == pytest.approx(price) and cost.per_100_tickers == pytest.approx(10 * price)  # type: ignore[operator]
