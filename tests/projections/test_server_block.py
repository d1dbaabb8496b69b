"""A run's server block: counter deltas over the run's window, gauges inside it, restarts, reconciliation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.projections.helpers import append, at, failed, finished, started
from usage_ledger.answers.reports import runs_report
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import NewEvent, ServerSampled, new_event
from usage_ledger.projections.calls import CallsProjection
from usage_ledger.projections.engine import live_version
from usage_ledger.projections.rebuild import rebuild_projection
from usage_ledger.projections.reconcile import Reconciliation, RunSpan, ServerTraffic, WindowCheck
from usage_ledger.projections.server import server_block

UPSTREAM = "http://127.0.0.1:8200"


def sample(
    t: float, *, requests: float, prompt: float, generation: float, running: float = 0.0, **extra: float
) -> ServerSampled:
    counters = {
        "vllm:request_success_total": requests,
        "vllm:prompt_tokens_total": prompt,
        "vllm:generation_tokens_total": generation,
        "vllm:spec_decode_num_drafts_total": extra.get("drafts", 0.0),
        "vllm:spec_decode_num_draft_tokens_total": extra.get("draft_tokens", 0.0),
        "vllm:spec_decode_num_accepted_tokens_total": extra.get("accepted", 0.0),
        "vllm:num_preemptions_total": extra.get("preemptions", 0.0),
        "vllm:prefix_cache_queries_total": extra.get("queries", 0.0),
        "vllm:prefix_cache_hits_total": extra.get("hits", 0.0),
    }
    gauges = {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": extra.get("waiting", 0.0),
        "vllm:kv_cache_usage_perc": extra.get("kv", 0.0),
    }
    return ServerSampled(upstream=UPSTREAM, sampled_at=at(t), counters=counters, gauges=gauges)


def check(
    samples: list[ServerSampled], t0: float, t1: float, *, requests: int, prompt: int, generation: int
) -> WindowCheck | None:
    """The reconciliation of one run from t0 to t1 that had the server to itself."""
    span = RunSpan(
        run="r",
        started_at=at(t0),
        ended_at=at(t1),
        requests=requests,
        prompt_tokens=prompt,
        generation_tokens=generation,
    )
    return ServerTraffic(samples, [span]).check("r")


def test_deltas_over_the_window_and_gauges_inside_it() -> None:
    samples = [
        sample(-20, requests=100, prompt=5000, generation=900),  # too early: not the window's start
        sample(-5, requests=110, prompt=6000, generation=1000),
        sample(
            10, requests=111, prompt=7000, generation=1100, running=2, kv=0.4, drafts=10, draft_tokens=30, accepted=15
        ),
        sample(
            20,
            requests=112,
            prompt=8000,
            generation=1200,
            running=4,
            kv=0.7,
            waiting=3,
            drafts=20,
            draft_tokens=60,
            accepted=30,
            preemptions=1,
        ),
        sample(
            31,
            requests=113,
            prompt=8000,
            generation=1300,
            drafts=30,
            draft_tokens=90,
            accepted=45,
            preemptions=1,
            queries=100,
            hits=25,
        ),
        sample(60, requests=200, prompt=9000, generation=2000),  # after the closing sample: not in it
    ]
    block = server_block(samples, at(0), at(30), check=check(samples, 0, 30, requests=3, prompt=2000, generation=300))
    assert block is not None
    assert (block.server_requests, block.server_prompt_tokens, block.server_generation_tokens) == (3, 2000, 300)
    assert block.reconciled is True and block.difference == Reconciliation(
        requests=0, prompt_tokens=0, generation_tokens=0
    )
    assert block.spec_decode_acceptance_rate == pytest.approx(45 / 90)
    assert block.spec_decode_mean_acceptance_length == pytest.approx(1 + 45 / 30)
    assert block.preemptions == 1 and block.prefix_cache_hit_rate == pytest.approx(0.25)
    assert (block.requests_running_mean, block.requests_running_max) == (3.0, 4.0)  # the two samples inside
    assert block.kv_cache_usage_max == 0.7 and block.requests_waiting_max == 3
    assert block.samples == 4 and block.window_start == at(-5) and block.window_end == at(31)
    assert "counter deltas" in block.sources["server_requests"] and "gauges" in block.sources["kv_cache_usage_max"]


def test_traffic_that_bypassed_the_gateway_shows_as_the_difference() -> None:
    samples = [sample(-1, requests=0, prompt=0, generation=0), sample(11, requests=5, prompt=900, generation=80)]
    block = server_block(samples, at(0), at(10), check=check(samples, 0, 10, requests=4, prompt=800, generation=70))
    assert block is not None and block.reconciled is False
    assert block.difference == Reconciliation(requests=1, prompt_tokens=100, generation_tokens=10)


def test_a_restart_inside_the_window_is_never_a_negative_or_merged_delta() -> None:
    samples = [
        sample(-1, requests=50, prompt=5000, generation=500),
        sample(5, requests=52, prompt=5200, generation=520),
        sample(6, requests=1, prompt=100, generation=10),  # restarted: counters went down
        sample(11, requests=3, prompt=300, generation=30),
    ]
    block = server_block(samples, at(0), at(10), check=check(samples, 0, 10, requests=5, prompt=500, generation=50))
    assert block is not None and block.restarts == 1
    assert block.reconciled is None and block.difference is None  # some of the run was not counted
    assert block.reconcile_note == "the server restarted 1× inside the window"


def test_no_sample_near_the_run_is_no_block() -> None:
    samples = [sample(-100, requests=0, prompt=0, generation=0)]
    assert server_block(samples, at(0), at(10), check=check(samples, 0, 10, requests=1, prompt=1, generation=1)) is None
    assert server_block([], at(0), at(10), check=None) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-50, 50), st.integers(0, 10**6)), min_size=2, max_size=12))
def test_deltas_are_never_negative(points: list[tuple[float, int]]) -> None:
    samples = sorted(
        (sample(t, requests=v, prompt=v * 10, generation=v * 2) for t, v in points), key=lambda s: s.sampled_at
    )
    block = server_block(samples, at(-10), at(10), check=check(samples, -10, 10, requests=0, prompt=0, generation=0))
    if block is not None and block.server_requests is not None:
        assert block.server_requests >= 0 and block.server_prompt_tokens is not None and block.server_prompt_tokens >= 0


async def test_report_runs_carries_the_block(database: Database) -> None:
    def sampled(t: float, **counts: float) -> NewEvent:
        return new_event(sample(t, **counts), stream="server", occurred_at=at(t))

    await append(
        database,
        sampled(-2, requests=10, prompt=100, generation=10),
        started("a", 0, run="nightly"),
        started("b", 1, run="nightly"),
        started("c", 1, run="nightly"),
        finished("a", 0, 5, prompt=1000, completion=100),
        finished("b", 1, 6, prompt=1000, completion=100),
        failed("c", 1, 2),
        sampled(7, requests=12, prompt=2100, generation=210),
        started("d", 100, run="unsampled"),
        finished("d", 100, 101),
    )
    rows = {r.run: r for r in await runs_report(database)}
    block = rows["nightly"].server
    assert block is not None and block.reconciled is True, block
    assert (block.server_requests, block.server_prompt_tokens) == (2, 2000)
    assert rows["unsampled"].server is None
    # the rebuild's bulk paths (SQL on each backend) pass over server.sampled events as the fold does
    followed = await calls_digest(database)
    await rebuild_projection(database, "calls")
    assert await calls_digest(database) == followed
    assert [r.server for r in await runs_report(database)] == [r.server for r in rows.values()]


async def calls_digest(database: Database) -> str:
    async with database.engine.connect() as conn:
        version, _ = await live_version(conn, "calls")
        return await CallsProjection().digest(conn, version)
