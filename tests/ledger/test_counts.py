"""The one plausibility rule for counts (`ledger.counts`): its edges, and what it says of any value."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from usage_ledger.ledger.counts import COUNT_BOUNDS, MAX_CALL_TOKENS, count_problem, plausible_count, usage_problem
from usage_ledger.ledger.events import Usage

_fields = st.sampled_from(sorted(COUNT_BOUNDS))
_values: st.SearchStrategy[Any] = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, MAX_CALL_TOKENS, MAX_CALL_TOKENS + 1, 2**62, 2**63, 2**64, -1, True, False]),
    st.floats(),
    st.none(),
    st.text(max_size=4),
)


@given(field=_fields, value=_values)
def test_a_count_is_plausible_exactly_when_a_whole_number_within_its_bound(field: str, value: Any) -> None:
    expected = type(value) is int and 0 <= value <= COUNT_BOUNDS[field]
    assert plausible_count(field, value) is expected
    assert (count_problem(field, value) == "") is expected


def test_the_bounds_keep_every_sum_inside_int64() -> None:
    """2³¹ calls at every field's bound still sum inside a signed 64-bit integer (SQLite INTEGER, BIGINT)."""
    assert all(bound * 2**31 < 2**63 for bound in COUNT_BOUNDS.values())
    assert MAX_CALL_TOKENS == 2**31 - 1


@pytest.mark.parametrize(
    ("usage", "named"),
    [
        (Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15, cached_tokens=0), ""),
        (Usage(prompt_tokens=2**63, completion_tokens=5, total_tokens=2**63 + 5), "prompt_tokens 9223372036854775808"),
        (Usage(prompt_tokens=1, completion_tokens=2**62, total_tokens=2**62 + 1), "completion_tokens"),
        (Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2, cached_tokens=2**64), "cached_tokens"),
    ],
)
def test_a_usage_names_its_implausible_counts(usage: Usage, named: str) -> None:
    problem = usage_problem(usage)
    assert (problem == "") is (named == "")
    assert named in problem
