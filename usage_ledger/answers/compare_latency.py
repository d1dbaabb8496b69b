"""Latency figures as `vllm bench serve` computes them (vllm/benchmarks/serve.py, `calculate_metrics`).

Percentiles are numpy's `linear` method in plain Python, interpolated as numpy's `_lerp` does, so they match
vLLM's to the last bit. A sample is held as counts per distinct value (millions of gaps, far fewer values).
Where vLLM prints 0 for an empty sample, these give None."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

__all__ = ("PERCENTILES", "Latency", "Sample", "latency_ms", "tpot_s")

PERCENTILES = (50.0, 90.0, 99.0)


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    """One latency's sample summarised in milliseconds; `n` values went into it."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float


class Sample:
    """Sorted distinct values with cumulative counts: order statistics without the full sorted list."""

    __slots__ = ("cumulative", "n", "total", "values")

    def __init__(self, counts: Mapping[int, int] | Mapping[float, int]) -> None:
        items = sorted((value, count) for value, count in counts.items() if count > 0)
        self.values = [value for value, _ in items]
        self.cumulative = list(itertools.accumulate(count for _, count in items))
        self.n = self.cumulative[-1] if self.cumulative else 0
        self.total = math.fsum(value * count for value, count in items)

    @classmethod
    def of(cls, values: Iterable[float]) -> Sample:
        return cls(Counter(values))

    def order_statistic(self, k: int) -> float:
        """The k-th smallest value (0-based)."""
        return self.values[bisect.bisect_right(self.cumulative, k)]

    def percentile(self, p: float) -> float | None:
        """numpy.percentile(sample, p) with the default `linear` method; None for an empty sample."""
        n = self.n
        if n == 0:
            return None
        virtual = (n - 1) * (p / 100)
        if virtual >= n - 1:
            return float(self.order_statistic(n - 1))
        below = math.floor(virtual)
        a, b = self.order_statistic(below), self.order_statistic(below + 1)
        weight = virtual - below
        diff = b - a
        return float(b - diff * (1 - weight) if weight >= 0.5 else a + diff * weight)

    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


def latency_ms(sample: Sample, unit: Literal["s", "us"]) -> Latency | None:
    """The sample (in seconds, or microseconds) in milliseconds, as vLLM scales them; None when it is empty."""
    if sample.n == 0:
        return None

    def ms(value: float | None) -> float:
        assert value is not None
        return value * 1000 if unit == "s" else value / 1000

    p50, p90, p99 = (ms(sample.percentile(p)) for p in PERCENTILES)
    return Latency(n=sample.n, mean=ms(sample.mean()), p50=p50, p90=p90, p99=p99)


def tpot_s(e2e_s: float, ttft_s: float, output_tokens: int) -> float | None:
    """Time per output token after the first: (e2e - TTFT) / (output - 1); only with more than one token."""
    return (e2e_s - ttft_s) / (output_tokens - 1) if output_tokens > 1 else None
