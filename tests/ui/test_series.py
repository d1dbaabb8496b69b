"""Chart data from calls: tokens are conserved by the per-second series, in-flight counts add up, histograms hold every value."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from usage_ledger.projections.rows import CallView
from usage_ledger.ui.series import (
    bucket_width_s,
    histogram,
    in_flight_series,
    nothing_to_draw,
    output_rate_series,
    token_times_source,
    tpot_values,
)

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def at(seconds: float | None) -> datetime | None:
    return None if seconds is None else T0 + timedelta(seconds=seconds)


def call(
    start: float, end: float | None, *, out: int = 100, first: float | None = None, status: str = "ok"
) -> CallView:
    ttft = None if first is None else first - start
    return CallView(
        call_id=f"c{start}-{end}",
        run="r",
        ticker=None,
        tags={},
        model="m",
        origin="gateway",
        source=None,
        status=status,
        http_status=200,
        failure_reason=None,
        usage_source="reported",
        started_at=T0 + timedelta(seconds=start),
        first_token_at=at(first),
        last_token_at=at(end),
        ended_at=at(end),
        elapsed_s=None if end is None else end - start,
        ttft_s=ttft,
        input_tokens=10,
        output_tokens=out,
        cached_tokens=None,
        prefill_tps=None,
        decode_tps=None,
        in_flight=1,
        retags=0,
        last_position=1,
    )


spans = st.lists(st.tuples(st.floats(0, 5000), st.floats(0, 3000), st.integers(1, 10_000)), min_size=1, max_size=40)


@given(spans)
def test_the_output_rate_series_conserves_tokens(parts: list[tuple[float, float, int]]) -> None:
    calls = [call(start, start + length, out=out, first=start) for start, length, out in parts]
    series = output_rate_series(calls)
    width = series.x[1] - series.x[0] if len(series.x) > 1 else bucket_width_s(0)
    assert sum(y or 0 for y in series.y) * width == pytest.approx(sum(out for _, _, out in parts), rel=1e-9)
    assert len(series.x) <= 121 and series.x == sorted(series.x)


@given(st.lists(st.tuples(st.floats(0, 100), st.one_of(st.none(), st.floats(0.001, 50))), min_size=1, max_size=30))
def test_in_flight_ends_at_the_calls_still_open(parts: list[tuple[float, float | None]]) -> None:
    calls = [call(start, None if length is None else start + length) for start, length in parts]
    series = in_flight_series(calls)
    assert series.y[-1] == sum(1 for _, length in parts if length is None)
    assert max(v or 0 for v in series.y) <= len(parts) and series.x == sorted(set(series.x))


def test_tpot_is_the_time_after_the_first_token_per_further_token() -> None:
    calls = [call(0, 10, out=11, first=2), call(0, 10, out=1, first=2), call(0, 10, out=11, first=2, status="failed")]
    assert tpot_values(calls) == [pytest.approx(0.8)]  # (10 - 2) / (11 - 1); one token and failed calls: none


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=200))
def test_a_histogram_holds_every_value(values: list[float]) -> None:
    h = histogram(values, unit="s", source="test")
    assert sum(h.counts) == h.values == len(values) and len(h.edges) == len(h.counts) + 1
    assert h.edges[0] == min(values) and h.edges[-1] >= max(values)


def test_bucket_widths_are_round() -> None:
    assert [bucket_width_s(s) for s in (10, 200, 3600, 86_400, 10**7, 10**8)] == [1, 2, 30, 900, 86_400, 833_334]


def test_an_empty_chart_says_why() -> None:
    failed = [
        call(0, 1, out=0, status="failed"),
        call(1, 2, out=0, status="failed"),
        call(2, None, status="incomplete"),
    ]
    assert output_rate_series(failed).source == "no ok call among the run's 3: 2 failed, 1 still open"
    assert nothing_to_draw([]) == "no calls in this run"
    assert nothing_to_draw([*failed, call(0, 5, first=1)]) is None
    assert token_times_source("ttft_s", 0, failed) == "no ok call among the run's 3: 2 failed, 1 still open"


def test_token_time_sources_count_the_ok_calls_they_leave_out() -> None:
    calls = [call(0, 10, first=1), call(0, 10), call(0, 10), call(0, 1, status="failed")]
    values = [c.ttft_s for c in calls if c.status == "ok" and c.ttft_s is not None]
    assert token_times_source("ttft_s", len(values), calls) == (
        "ttft_s: 1 of the 3 ok calls (only a streamed call has token times)"
    )
