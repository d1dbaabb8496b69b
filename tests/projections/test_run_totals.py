"""Run totals (properties), on both backends: a tagged run and the same calls untagged add up alike, and
untagged calls are cut into runs by the documented rule (a call that starts more than the gap after every
earlier call's start and end opens a run, named after its start), kept here as a Python oracle."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert

from tests.projections.helpers import T0
from usage_ledger.answers._aggregate import RunAcc, collect_runs
from usage_ledger.ledger.db import Database
from usage_ledger.projections import CALL_STATUSES
from usage_ledger.projections.tables import calls

_versions = itertools.count(1000)  # a version of the calls read model per example: examples share a database

_call = st.fixed_dictionaries(
    {
        "started_us": st.integers(0, 600_000_000),  # within 10 minutes, to the microsecond
        "lasted_us": st.none() | st.integers(-2_000_000, 120_000_000),  # no end, or one (before the start too)
        "status": st.sampled_from(CALL_STATUSES),
        "input_tokens": st.integers(0, 10**6),
        "output_tokens": st.integers(0, 10**6),
        "elapsed_s": st.none() | st.sampled_from([0.0, -1.0]) | st.floats(0.001, 1e4),
        "model": st.sampled_from([None, "a", "b"]),
        "ticker": st.sampled_from([None, "T1", "T2"]),
        "spec": st.none() | st.tuples(st.integers(0, 10**4), st.integers(0, 10**4), st.integers(0, 10**4)),
        "finish_reason": st.sampled_from([None, "stop", "length", "max_output_tokens", "tool_calls"]),
    }
)
_calls = st.lists(_call, min_size=1, max_size=25)


def _started(call: dict[str, Any]) -> datetime:
    return T0 + timedelta(microseconds=call["started_us"])


def _ended(call: dict[str, Any]) -> datetime | None:
    return None if call["lasted_us"] is None else _started(call) + timedelta(microseconds=call["lasted_us"])


async def _insert(database: Database, version: int, run: str | None, drawn: list[dict[str, Any]]) -> None:
    rows = [
        {
            "version": version,
            "call_id": f"c{i:03d}",
            "run": run,
            "ticker": call["ticker"],
            "tags": "{}",
            "model": call["model"],
            "origin": "gateway",
            "status": call["status"],
            "usage_source": "reported",
            "started_at": _started(call),
            "ended_at": _ended(call),
            "elapsed_s": call["elapsed_s"],
            "input_tokens": call["input_tokens"],
            "output_tokens": call["output_tokens"],
            "spec_draft_tokens": call["spec"] and call["spec"][0],
            "spec_accepted_tokens": call["spec"] and call["spec"][1],
            "spec_steps": call["spec"] and call["spec"][2],
            "finish_reason": call["finish_reason"],
            "retags": 0,
            "last_position": i,
        }
        for i, call in enumerate(drawn)
    ]
    async with database.engine.begin() as conn:
        await conn.execute(insert(calls), rows)


def _totals(acc: RunAcc) -> dict[str, Any]:
    fields = {name: getattr(acc, name) for name in RunAcc.__slots__ if name != "rate_sum"}
    return {**fields, "rate_sum": pytest.approx(acc.rate_sum, rel=1e-9)}  # a float sum in any order


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_calls, model=st.sampled_from([None, "a"]))
async def test_a_run_adds_up_alike_tagged_and_untagged(
    database: Database, drawn: list[dict[str, Any]], model: str | None
) -> None:
    tagged, untagged = next(_versions), next(_versions)
    await _insert(database, tagged, "r", drawn)
    await _insert(database, untagged, None, drawn)
    selected = [calls.c.model == model] if model else []
    async with database.engine.connect() as conn:
        as_tagged = await collect_runs(conn, tagged, selected=selected)
        as_untagged = await collect_runs(conn, untagged, run_gap_s=10**9, selected=selected)  # one run
    assert list(as_tagged) == (["r"] if as_untagged else [])
    assert [_totals(acc) for acc in as_untagged.values()] == [_totals(acc) for acc in as_tagged.values()]


def _oracle(drawn: list[dict[str, Any]], gap: float) -> dict[str, list[int]]:
    """The documented cut, call by call in start order: each run's name and its calls (indices)."""
    runs: dict[str, list[int]] = {}
    horizon: datetime | None = None  # the latest start or end of the calls so far
    for i in sorted(range(len(drawn)), key=lambda i: _started(drawn[i])):
        started = _started(drawn[i])
        if horizon is None or (started - horizon).total_seconds() > gap:
            name = "auto-" + started.strftime("%Y-%m-%dT%H:%M:%SZ")
            while name in runs:
                name += "+"
            runs[name] = []
        runs[name].append(i)
        horizon = max(horizon or started, started, _ended(drawn[i]) or started)
    return runs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_calls, gap=st.sampled_from([0.0, 0.5, 30.0, 90.000001]), ok_only=st.booleans())
async def test_untagged_calls_are_cut_where_the_rule_says(
    database: Database, drawn: list[dict[str, Any]], gap: float, ok_only: bool
) -> None:
    version = next(_versions)
    await _insert(database, version, None, drawn)
    async with database.engine.connect() as conn:
        found = await collect_runs(conn, version, run_gap_s=gap, selected=[calls.c.status == "ok"] if ok_only else [])
    expected = {
        name: [drawn[i] for i in members if not ok_only or drawn[i]["status"] == "ok"]
        for name, members in _oracle(drawn, gap).items()
    }
    expected = {name: members for name, members in expected.items() if members}
    assert {name: acc.calls for name, acc in found.items()} == {name: len(m) for name, m in expected.items()}
    for name, members in expected.items():
        starts = [_started(call) for call in members]
        assert (found[name].first_start, found[name].last_start) == (min(starts), max(starts))


async def test_a_call_a_microsecond_past_the_gap_opens_a_run(database: Database) -> None:
    plain = {"status": "ok", "input_tokens": 1, "output_tokens": 1, "elapsed_s": None, "model": None}
    plain |= {"ticker": None, "spec": None, "finish_reason": None}
    drawn = [
        {**plain, "started_us": 0, "lasted_us": 1_000_000},
        {**plain, "started_us": 1_300_000, "lasted_us": 0},  # 0.3 s after the latest end: the same run
        {**plain, "started_us": 1_600_001, "lasted_us": None},  # 0.300001 s: a run of its own
    ]
    version = next(_versions)
    await _insert(database, version, None, drawn)
    async with database.engine.connect() as conn:
        found = await collect_runs(conn, version, run_gap_s=0.3)
    assert {name: acc.calls for name, acc in found.items()} == {
        "auto-2026-03-02T12:00:00Z": 2,
        "auto-2026-03-02T12:00:01Z": 1,
    }
    assert {name: len(members) for name, members in _oracle(drawn, 0.3).items()} == {
        name: acc.calls for name, acc in found.items()
    }
