"""Throughput formulas, registered in one place (docs/formulas.md).

A run with no completed call has no throughput under any formula (registration adds the rule, once):
a run of failures would otherwise enter a mean as 0 tok/s."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime

import msgspec

from usage_ledger.projections.errors import UnknownFormula

__all__ = ("DEFAULT_FORMULA", "FORMULAS", "RunStats", "formula", "get_formula")

DEFAULT_FORMULA = "batch_aggregate"


class RunStats(msgspec.Struct, frozen=True, kw_only=True):
    """What a formula may use about a run.

    `rate_sum` / `rate_calls`: Σ and count of output tokens ÷ call elapsed over the run's
    successful (`ok`) calls with a positive elapsed time.
    """

    calls: int
    completed_calls: int
    """Calls with status `ok`."""
    output_tokens: int
    input_tokens: int
    first_start: datetime | None
    last_end: datetime | None
    rate_sum: float
    rate_calls: int

    @property
    def wall_s(self) -> float | None:
        if self.first_start is None or self.last_end is None:
            return None
        return (self.last_end - self.first_start).total_seconds()


Formula = Callable[[RunStats], "float | None"]
FORMULAS: dict[str, Formula] = {}


def formula(name: str) -> Callable[[Formula], Formula]:
    """Register a formula under `name`."""

    def register(fn: Formula) -> Formula:
        @functools.wraps(fn)
        def delivered(stats: RunStats) -> float | None:
            return fn(stats) if stats.completed_calls else None

        FORMULAS[name] = delivered
        return delivered

    return register


def get_formula(name: str) -> Formula:
    try:
        return FORMULAS[name]
    except KeyError:
        raise UnknownFormula(f"unknown formula {name!r}; known: {', '.join(sorted(FORMULAS))}") from None


@formula("batch_aggregate")
def batch_aggregate(stats: RunStats) -> float | None:
    """Σ output tokens ÷ (last call end - first call start): the number to trust under batching."""
    wall = stats.wall_s
    return stats.output_tokens / wall if wall and wall > 0 else None


@formula("per_call_mean")
def per_call_mean(stats: RunStats) -> float | None:
    """Mean over calls of output tokens ÷ call elapsed (the older, per-request view)."""
    return stats.rate_sum / stats.rate_calls if stats.rate_calls else None
