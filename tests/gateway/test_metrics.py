"""The latency histograms render as Prometheus expects: cumulative buckets, sum and count."""

from __future__ import annotations

from usage_ledger.gateway.metrics import Histogram


def test_histogram_buckets_are_cumulative() -> None:
    histogram = Histogram(buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 7.0):
        histogram.observe(value)
    assert histogram.render("x", "h") == [
        "# HELP x h",
        "# TYPE x histogram",
        'x_bucket{le="0.1"} 2',
        'x_bucket{le="1"} 3',
        'x_bucket{le="+Inf"} 4',
        "x_sum 7.650000",
        "x_count 4",
    ]
