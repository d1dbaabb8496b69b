"""A small ledger with known contents for the CLI-fit, filter and admin-filter tests.

    alpha  model m1   2026-03-02 12:00:00-12:00:21 UTC   a1, a2 ok (overlapping), a3 failed
    beta   model m2   2026-03-02 14:00:00-14:01:50 UTC   b1 ok, b2 error (HTTP 500)
    untagged, m1      2026-03-03 12:00:00 UTC            u1, u2 (100 s later): auto-2026-03-03T12:00:00Z
                      2026-03-03 13:23:20 UTC            u3 (after a gap): auto-2026-03-03T13:23:20Z

Server samples bracket alpha, so alpha's row has a server block (reconciled, acceptance).
"""

from __future__ import annotations

from tests.projections.helpers import append, at, failed, finished, started
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import NewEvent, ServerSampled, new_event
from usage_ledger.projections.engine import catch_up_all

DAY = 86_400
AUTO_1 = "auto-2026-03-03T12:00:00Z"
AUTO_2 = "auto-2026-03-03T13:23:20Z"
LONG_RUN = "nightly-benchmark-" + "x" * 40
UPSTREAM = "http://127.0.0.1:8200"


def _sample(t: float, requests: float, prompt: float, generation: float, drafts: float) -> NewEvent:
    body = ServerSampled(
        upstream=UPSTREAM,
        sampled_at=at(t),
        counters={
            "vllm:request_success_total": requests,
            "vllm:prompt_tokens_total": prompt,
            "vllm:generation_tokens_total": generation,
            "vllm:spec_decode_num_drafts_total": drafts,
            "vllm:spec_decode_num_draft_tokens_total": drafts * 3,
            "vllm:spec_decode_num_accepted_tokens_total": drafts * 2,
        },
        gauges={"vllm:num_requests_running": 2.0, "vllm:kv_cache_usage_perc": 0.5},
    )
    return new_event(body, stream="server", occurred_at=at(t))


async def seed_fit_ledger(database: Database, *, samples: bool = True, long_run: bool = False) -> None:
    events = [
        started("a1", 0, run="alpha", ticker="T1", model="m1"),
        finished("a1", 0, 10, prompt=1_234_567, completion=2000),
        started("a2", 5, run="alpha", ticker="T2", model="m1"),
        finished("a2", 5, 15, prompt=1000, completion=101),
        started("a3", 20, run="alpha", ticker="T1", model="m1"),
        failed("a3", 20, 21),
        started("b1", 7200, run="beta", ticker="T1", model="m2"),
        finished("b1", 7200, 7260, prompt=5000, completion=500),
        started("b2", 7300, run="beta", ticker="T3", model="m2"),
        finished("b2", 7300, 7310, prompt=10, completion=0, status=500),
        started("u1", DAY, model="m1"),
        finished("u1", DAY, DAY + 50),
        started("u2", DAY + 100, model="m1"),
        finished("u2", DAY + 100, DAY + 110),
        started("u3", DAY + 5000, model="m1"),
        finished("u3", DAY + 5000, DAY + 5010),
    ]
    if samples:
        events += [_sample(-1, 0, 0, 0, 0), _sample(30, 2, 1_235_567, 2101, 100)]
    if long_run:
        events += [started("l1", 3 * DAY, run=LONG_RUN, model="m1"), finished("l1", 3 * DAY, 3 * DAY + 3)]
    await append(database, *events)
    await catch_up_all(database)
