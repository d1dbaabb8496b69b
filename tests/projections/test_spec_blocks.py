"""vLLM's per-request speculative-decoding blocks: kept per call by one rule (`call_rules.spec_decode_counts`),
stored as the rule says on both backends, summed per run, and preferred over counter deltas when every
completed call of the run has one."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, select

from tests.projections.helpers import append, at, failed, finished, spec_metrics, started
from tests.projections.test_server_block import calls_digest, sample
from usage_ledger.answers.reports import runs_report
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import NewEvent, new_event
from usage_ledger.ledger.migrate import downgrade_database, upgrade_database
from usage_ledger.ledger.read import head_position
from usage_ledger.projections.call_rules import SPEC_DECODE_KEYS, spec_decode_counts
from usage_ledger.projections.calls import CallsProjection
from usage_ledger.projections.engine import catch_up, write_checkpoint
from usage_ledger.projections.rebuild import rebuild_projection
from usage_ledger.projections.tables import calls

_serial = itertools.count()

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
# counters near the rule's edges, booleans, floats, strings; keys sometimes missing
_counter = st.one_of(
    st.integers(0, 5000),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 10**15, 2**63 - 1, True, False, 3.0, 1e20, "7", None]),
    _json,
)
_block = st.one_of(
    st.fixed_dictionaries({}, optional=dict.fromkeys(SPEC_DECODE_KEYS, _counter)),
    st.fixed_dictionaries(dict.fromkeys(SPEC_DECODE_KEYS, st.integers(0, 10**6))),
    _json,
)
_metrics = st.one_of(st.none(), st.builds(lambda block: {"speculative_decoding": block}, _block))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metrics=st.lists(_metrics, min_size=1, max_size=12))
async def test_the_rows_keep_the_counters_the_rule_keeps(database: Database, metrics: list[Any]) -> None:
    """The stored rows hold the rule's counters (BIGINT on both backends), the same followed or rebuilt."""
    salt = next(_serial)
    ids = [f"s{salt}-{i}" for i in range(len(metrics))]
    followed, loaded = 5000 + 2 * salt, 5001 + 2 * salt
    # Both versions start where this example's events do: each example folds its own events only, so the
    # test stays linear in the examples (from position 0 it re-read every earlier example's, one per page).
    async with database.engine.begin() as conn:
        start = await head_position(conn)
        for version in (followed, loaded):
            await write_checkpoint(conn, "calls", version, start)
    await append(
        database,
        *(started(cid, i) for i, cid in enumerate(ids)),
        *(finished(cid, i, i + 2, request_metrics=m) for i, (cid, m) in enumerate(zip(ids, metrics, strict=True))),
    )
    await catch_up(database, "calls", followed, page_size=1)
    await catch_up(database, "calls", loaded)
    projection = CallsProjection()
    columns = (calls.c.spec_draft_tokens, calls.c.spec_accepted_tokens, calls.c.spec_steps)
    async with database.engine.connect() as conn:
        assert await projection.digest(conn, followed) == await projection.digest(conn, loaded)
        query = select(calls.c.call_id, *columns).where(calls.c.version == loaded, calls.c.call_id.in_(ids))
        rows = {r[0]: tuple(r[1:]) for r in await conn.execute(query)}
    for cid, m in zip(ids, metrics, strict=True):
        counts = spec_decode_counts(m["speculative_decoding"]) if m is not None else None
        assert rows[cid] == (counts or (None, None, None)), m


def test_the_rule() -> None:
    assert spec_decode_counts(spec_metrics(30, 15, 10)["speculative_decoding"]) == (30, 15, 10)
    assert spec_decode_counts({"num_draft_tokens": 0, "num_accepted_draft_tokens": 0, "num_spec_steps": 0}) == (0, 0, 0)
    for odd in (True, 3.0, -1, 10**15, "5", None):
        assert (
            spec_decode_counts({"num_draft_tokens": odd, "num_accepted_draft_tokens": 1, "num_spec_steps": 1}) is None
        )
    assert spec_decode_counts({"num_draft_tokens": 1, "num_accepted_draft_tokens": 1}) is None
    assert spec_decode_counts(None) is None and spec_decode_counts([1, 2, 3]) is None


def _sampled(t: float, **counts: float) -> NewEvent:
    return new_event(sample(t, **counts), stream="server", occurred_at=at(t))


async def test_blocks_are_preferred_when_every_completed_call_has_one(database: Database) -> None:
    await append(
        database,
        # counters say 50 % (the server also served someone else); the run's own blocks say 40/100
        _sampled(-2, requests=0, prompt=0, generation=0),
        started("a", 0, run="blocks"),
        started("b", 1, run="blocks"),
        started("c", 1, run="blocks"),
        finished("a", 0, 5, request_metrics=spec_metrics(60, 30, 20)),
        finished("b", 1, 6, request_metrics=spec_metrics(40, 10, 20)),
        failed("c", 1, 2),  # an aborted call has no block; it does not stop the preference
        _sampled(7, requests=2, prompt=2000, generation=202, drafts=100, draft_tokens=200, accepted=100),
        started("d", 20, run="one-missing"),
        started("e", 20, run="one-missing"),
        finished("d", 20, 22, request_metrics=spec_metrics(10, 9, 5)),
        finished("e", 20, 22, request_metrics={"time_to_first_token_ms": 3.0}),
        started("f", 40, run="unsampled"),
        finished("f", 40, 42, request_metrics=spec_metrics(10, 5, 4)),
        started("g", 5000),  # untagged: its gap-cut run has blocks too
        finished("g", 5000, 5002, request_metrics=spec_metrics(8, 2, 4)),
    )
    rows = {r.run: r for r in await runs_report(database)}

    block = rows["blocks"].server
    assert block is not None and block.samples == 2 and block.reconciled is True
    assert block.spec_decode_acceptance_rate == pytest.approx(40 / 100)
    assert block.spec_decode_mean_acceptance_length == pytest.approx(1 + 40 / 40)
    source = "vllm per-request speculative_decoding blocks summed over 2 calls"
    assert block.sources["spec_decode_acceptance_rate"] == source
    assert block.sources["spec_decode_mean_acceptance_length"] == source
    assert block.sources["server_requests"].startswith("vllm counter deltas")

    assert rows["one-missing"].server is None  # no sample around it and a call without a block

    alone = rows["unsampled"].server
    assert alone is not None and alone.samples == 0 and alone.reconciled is None and alone.server_requests is None
    assert (alone.spec_decode_acceptance_rate, alone.spec_decode_mean_acceptance_length) == (0.5, 1 + 5 / 4)
    assert set(alone.sources) == {"spec_decode_acceptance_rate", "spec_decode_mean_acceptance_length"}

    (auto,) = (r for r in rows.values() if r.run.startswith("auto-"))
    assert auto.server is not None and auto.server.spec_decode_acceptance_rate == 0.25

    followed = await calls_digest(database)
    await rebuild_projection(database, "calls")
    assert await calls_digest(database) == followed
    assert [r.server for r in await runs_report(database)] == [r.server for r in rows.values()]


async def test_counter_deltas_when_a_completed_call_has_no_block(database: Database) -> None:
    await append(
        database,
        _sampled(-2, requests=0, prompt=0, generation=0),
        started("a", 0, run="mixed"),
        started("b", 0, run="mixed"),
        finished("a", 0, 5, request_metrics=spec_metrics(60, 30, 20)),
        finished("b", 0, 5),
        _sampled(7, requests=2, prompt=2000, generation=202, drafts=100, draft_tokens=200, accepted=100),
    )
    (row,) = await runs_report(database)
    assert row.server is not None and row.server.spec_decode_acceptance_rate == 0.5
    assert row.server.sources["spec_decode_acceptance_rate"].startswith("vllm counter deltas")


async def test_rows_survive_the_migration_down_and_up(database: Database) -> None:
    """0003 adds the three columns to `projection_calls` and drops them again; the other columns stay."""
    await append(database, started("a", 0, run="r"), finished("a", 0, 2, request_metrics=spec_metrics(6, 3, 2)))
    assert (await runs_report(database))[0].server is not None
    await downgrade_database(database, "0002")
    async with database.engine.connect() as conn:
        names = await conn.run_sync(lambda c: {col["name"] for col in inspect(c).get_columns("projection_calls")})
    assert "spec_steps" not in names and "cached_tokens" in names
    await upgrade_database(database)
    (row,) = await runs_report(database)
    # 0004 sets the calls checkpoints back to 0, so the follower folds every event again: the counters are back
    assert row.calls == 1 and row.server is not None
    await rebuild_projection(database, "calls")
    (row,) = await runs_report(database)
    assert row.server is not None and row.server.spec_decode_acceptance_rate == 0.5
