"""What a run cost: its wall time × the price per hour annotated on it (docs/decide.md). A run without both
labels, or with a price that is not a positive number, has no cost: nothing is guessed."""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

__all__ = ("CURRENCY_LABEL", "PRICE_LABEL", "CostMeans", "RunCost", "cost_means", "parse_price", "run_cost")

PRICE_LABEL = "price_per_hour"
CURRENCY_LABEL = "currency"


class RunCost(msgspec.Struct, frozen=True, kw_only=True):
    currency: str
    price_per_hour: float
    run: float
    """Wall hours × the price."""
    per_100_tickers: float | None
    """Hours per 100 tickers (done) × the price; None without tickers."""
    per_million_output_tokens: float | None
    """The run's cost ÷ its output tokens × 10⁶; None without output."""


def parse_price(text: str) -> float | None:
    """A price per hour: a finite number above 0 (else None)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def run_cost(
    labels: dict[str, str], wall_s: float | None, hours_per_100_tickers: float | None, output_tokens: int
) -> RunCost | None:
    """The run's cost from its labels; None without a (valid) price and currency, or without a wall time."""
    price = parse_price(labels.get(PRICE_LABEL, ""))
    currency = labels.get(CURRENCY_LABEL)
    if price is None or not currency or wall_s is None:
        return None
    cost = wall_s / 3600 * price
    return RunCost(
        currency=currency,
        price_per_hour=price,
        run=cost,
        per_100_tickers=hours_per_100_tickers * price if hours_per_100_tickers is not None else None,
        per_million_output_tokens=cost / output_tokens * 1e6 if output_tokens else None,
    )


class CostMeans(msgspec.Struct, frozen=True, kw_only=True):
    """Means over the priced runs of a group (eras, decide), all in one currency."""

    currency: str
    priced_runs: int
    per_100_tickers: float | None
    per_million_output_tokens: float | None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def cost_means(costs: Iterable[RunCost | None]) -> CostMeans | None:
    """None when no run is priced, or the prices are in more than one currency (never converted)."""
    priced = [c for c in costs if c is not None]
    if len({c.currency for c in priced}) != 1:
        return None
    return CostMeans(
        currency=priced[0].currency,
        priced_runs=len(priced),
        per_100_tickers=_mean([c.per_100_tickers for c in priced]),
        per_million_output_tokens=_mean([c.per_million_output_tokens for c in priced]),
    )
