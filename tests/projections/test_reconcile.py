"""Reconciliation windows between idle samples (issue #53, point 1): back-to-back runs reconcile together,
traffic around the gateway is still caught, and a difference in a shared window names every run in it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.projections.helpers import append, at, finished, started
from usage_ledger.answers.reports import runs_report
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import NewEvent, ServerSampled, new_event
from usage_ledger.projections.reconcile import Reconciliation, RunSpan, ServerTraffic

A = "http://127.0.0.1:8200"
B = "http://127.0.0.1:8201"
EQUAL = Reconciliation(requests=0, prompt_tokens=0, generation_tokens=0)


def sample(
    t: float, requests: int, prompt: int, generation: int, *, run: str | None = None, upstream: str = A
) -> ServerSampled:
    """A scrape requested at t - 0.05 and answered at t."""
    counters = {
        "vllm:request_success_total": float(requests),
        "vllm:prompt_tokens_total": float(prompt),
        "vllm:generation_tokens_total": float(generation),
    }
    return ServerSampled(upstream=upstream, sampled_at=at(t), requested_at=at(t - 0.05), run=run, counters=counters)


def span(run: str, t0: float, t1: float, calls: int) -> RunSpan:
    """`calls` calls of 1000 prompt and 100 generated tokens each."""
    return RunSpan(
        run=run,
        started_at=at(t0),
        ended_at=at(t1),
        requests=calls,
        prompt_tokens=1000 * calls,
        generation_tokens=100 * calls,
    )


# Three runs sent back to back: each next run's first call arrives as the last one ends, so the samples its
# start and the previous run's end trigger are taken with calls in flight, holding part of a neighbour's work.
BACK_TO_BACK = [
    sample(-2, 0, 0, 0),
    sample(6.2, 2, 3000, 210, run="b"),  # b's start: a done, b's first prefill counted
    sample(7.1, 2, 4000, 260, run="a"),  # a's end, 1 s later: b is running
    sample(12.2, 4, 5000, 420, run="c"),  # c's start: b done, c's prefill counted
    sample(13.1, 4, 5000, 440, run="b"),  # b's end: c is running
    sample(17.5, 5, 5000, 500, run="c"),  # c's end: idle
]
SPANS = [span("a", 0, 6, 2), span("b", 6.05, 12, 2), span("c", 12.1, 16, 1)]


def test_back_to_back_runs_reconcile_together() -> None:
    traffic = ServerTraffic(BACK_TO_BACK, SPANS)
    for run, others in (("a", ["b", "c"]), ("b", ["a", "c"]), ("c", ["a", "b"])):
        check = traffic.check(run)
        assert check is not None and check.reconciled is True, (run, check)
        assert check.difference == EQUAL and check.shared_with == others
        assert (check.window_start, check.window_end, check.samples) == (at(-2), at(17.5), 6)
        assert (check.server_requests, check.server_prompt_tokens, check.server_generation_tokens) == (5, 5000, 500)


def test_calls_around_the_gateway_during_a_run_of_its_own_are_caught() -> None:
    samples = [*BACK_TO_BACK, sample(29, 5, 5000, 500, run="d"), sample(36, 9, 7500, 730, run="d")]
    traffic = ServerTraffic(samples, [*SPANS, span("d", 30, 35, 1)])  # d: 1 call recorded, the server saw 4
    check = traffic.check("d")
    assert check is not None and check.reconciled is False and check.shared_with == []
    assert check.difference == Reconciliation(requests=3, prompt_tokens=1500, generation_tokens=130)
    assert all(traffic.check(run).reconciled is True for run in "abc")  # type: ignore[union-attr]


def test_a_difference_in_a_shared_window_names_every_run_in_it() -> None:
    samples = [*BACK_TO_BACK[:-1], sample(17.5, 6, 5100, 510, run="c")]  # one request more than the ledger's
    traffic = ServerTraffic(samples, SPANS)
    for run in "abc":
        check = traffic.check(run)
        assert check is not None and check.reconciled is False and len(check.shared_with) == 2
        assert check.difference == Reconciliation(requests=1, prompt_tokens=100, generation_tokens=10)


def test_runs_on_another_server_do_not_share_a_window() -> None:
    """Two gateways, two servers, one ledger: a run on B in flight during A's samples leaves them idle for A."""
    samples = [
        sample(-1, 0, 0, 0, upstream=A),
        sample(0.5, 0, 0, 0, run="other", upstream=B),
        sample(5, 1, 1000, 100, run="mine", upstream=A),
        sample(20, 7, 7000, 700, run="other", upstream=B),
    ]
    traffic = ServerTraffic(samples, [span("mine", 0, 4, 1), span("other", 0.4, 19, 7)])
    mine = traffic.check("mine")
    assert mine is not None and mine.reconciled is True and mine.shared_with == []


def test_a_run_without_an_idle_sample_after_it_is_not_checked() -> None:
    traffic = ServerTraffic(BACK_TO_BACK[:-1], SPANS)
    check = traffic.check("a")
    assert check is not None and check.reconciled is None and check.problem == "no idle server sample after the run"


def test_an_unattributable_run_in_the_window_is_said() -> None:
    """With two servers, untagged calls no sample names may have gone to either: the window is not checked."""
    samples = [sample(-1, 0, 0, 0), sample(9, 2, 2000, 200, run="mine"), sample(9, 0, 0, 0, upstream=B)]
    traffic = ServerTraffic(samples, [span("mine", 0, 4, 1), span("auto-x", 5, 6, 1)])
    check = traffic.check("mine")
    assert check is not None and check.reconciled is None and check.problem is not None and "auto-x" in check.problem


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.1, 20), st.integers(1, 5)), min_size=1, max_size=8))
def test_a_server_that_saw_exactly_the_ledger_always_reconciles(calls: list[tuple[float, float, int]]) -> None:
    """Whatever the runs' overlaps and the samples' moments: a sample counts every call ended before it was
    requested (the idle ones hold nothing in flight); every run with idle samples around it reconciles."""
    spans = [span(f"r{i}", t, t + d, n) for i, (t, d, n) in enumerate(calls)]
    moments = [x * 2.5 for x in range(-1, 60)]

    def seen(t: float) -> ServerSampled:
        done = [s for s in spans if s.ended_at <= at(t - 0.05)]
        n = sum(s.requests for s in done)
        return sample(t, n, 1000 * n, 100 * n)

    traffic = ServerTraffic([seen(t) for t in moments], spans)
    for s in spans:
        check = traffic.check(s.run)
        assert check is not None
        assert check.reconciled is True or check.problem is not None, check


def sampled(event: ServerSampled) -> NewEvent:
    return new_event(event, stream="server", occurred_at=event.sampled_at)


async def test_the_runs_report_reconciles_back_to_back_runs(database: Database) -> None:
    calls = [
        ("a1", 0, 5, "a"),
        ("a2", 1, 6, "a"),
        ("b1", 6.05, 11, "b"),
        ("b2", 6.5, 12, "b"),
        ("c1", 12.1, 16, "c"),
    ]
    await append(
        database,
        *(started(call, t0, run=run) for call, t0, _, run in calls),
        *(finished(call, t0, t1, prompt=1000, completion=100) for call, t0, t1, _ in calls),
        *(sampled(s) for s in BACK_TO_BACK),
    )
    rows = await runs_report(database)
    assert [r.run for r in rows] == ["a", "b", "c"]
    for row in rows:
        assert row.server is not None and row.server.reconciled is True, row.server
        assert row.server.reconciled_with == [r.run for r in rows if r.run != row.run]
    (single,) = await runs_report(database, run="b")  # one run asked for: its window still sees its neighbours
    assert single.server == rows[1].server
