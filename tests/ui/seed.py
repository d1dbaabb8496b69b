"""A ledger with known contents for the dashboard's tests (events built as tests/projections/helpers does).

Two runs a day apart on different hardware (annotated), one failed call, one call with stored
bodies, one whose request body was redacted, and three server samples around the first run.

    moe-a    6 calls, tickers AAPL ×3 and MSFT ×3, model qwen-moe, hardware a100, 2026-03-02 12:00 UTC
    dense-b  4 calls (1 failed), ticker NVDA, model gemma-dense, hardware h100, 2026-03-03 22:00 UTC
             (= 2026-03-04 07:00 in Asia/Seoul: the daily table's days depend on the zone)
"""

from __future__ import annotations

from datetime import timedelta

import msgspec

from tests.projections.helpers import append, at, failed, finished, started
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, redact_blob
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import (
    BlobRedacted,
    CallFinished,
    NewEvent,
    RunAnnotated,
    ServerSampled,
    Timings,
    new_event,
)
from usage_ledger.projections.engine import catch_up_all

MOE_CALLS = 6
DENSE_CALLS = 4
DENSE_START_S = 86_400 + 10 * 3600  # 2026-03-03 22:00 UTC
BODY_CALL = "moe-a-0"
REDACTED_CALL = "moe-a-1"
REQUEST_BODY = b'{"model": "qwen-moe", "messages": [{"role": "user", "content": "price of AAPL <b>today</b>"}]}'
RESPONSE_BODY = b'{"choices": [{"message": {"content": "a secret answer"}}]}'
SECRET_BODY = b'{"messages": [{"role": "user", "content": "this prompt was redacted"}]}'
UPSTREAM = "http://127.0.0.1:8200"


def _sample(t: float, *, running: float, kv: float, waiting: float, drafted: float, accepted: float) -> ServerSampled:
    return ServerSampled(
        upstream=UPSTREAM,
        sampled_at=at(t),
        requested_at=at(t) - timedelta(milliseconds=5),
        run="moe-a",
        counters={
            "vllm:spec_decode_num_draft_tokens_total": drafted,
            "vllm:spec_decode_num_accepted_tokens_total": accepted,
            "vllm:spec_decode_num_drafts_total": drafted / 3,
        },
        gauges={
            "vllm:num_requests_running": running,
            "vllm:kv_cache_usage_perc": kv,
            "vllm:num_requests_waiting": waiting,
        },
    )


async def seed_ledger(database: Database) -> None:
    compressor = BlobCompressor()
    request, response, secret = (compressor.prepare(body) for body in (REQUEST_BODY, RESPONSE_BODY, SECRET_BODY))
    assert request is not None and response is not None and secret is not None
    moe = []
    for i in range(MOE_CALLS):  # three lanes of two calls: 3 in flight, then 3 more
        t0 = 10.0 * (i // 3) + i % 3
        begin = started(f"moe-a-{i}", t0, run="moe-a", ticker="AAPL" if i < 3 else "MSFT", model="qwen-moe")
        end = finished(f"moe-a-{i}", t0, t0 + 8, prompt=1000 + i, completion=200 + 10 * i, ttft=0.2 + 0.1 * i)
        if i == 0:
            begin = msgspec.structs.replace(begin, body=msgspec.structs.replace(begin.body, request_blob=request.hash))
            end = msgspec.structs.replace(end, body=msgspec.structs.replace(end.body, response_blob=response.hash))
        if i == 1:
            begin = msgspec.structs.replace(begin, body=msgspec.structs.replace(begin.body, request_blob=secret.hash))
        moe += [begin, end]
    await append_events(database, moe, [request, response, secret])
    dense = []
    for i in range(DENSE_CALLS):
        t0 = DENSE_START_S + 30.0 * i
        dense.append(started(f"dense-b-{i}", t0, run="dense-b", ticker="NVDA", model="gemma-dense"))
        dense.append(failed(f"dense-b-{i}", t0, t0 + 1) if i == 3 else finished(f"dense-b-{i}", t0, t0 + 25))
    await append(database, *dense)
    await append(
        database,
        new_event(RunAnnotated(run="moe-a", labels={"hardware": "a100"}), stream="run-moe-a"),
        new_event(RunAnnotated(run="dense-b", labels={"hardware": "h100"}), stream="run-dense-b"),
        *(
            new_event(s, stream="server")
            for s in (
                _sample(-2, running=0, kv=0.0, waiting=0, drafted=0, accepted=0),
                _sample(9, running=3, kv=0.4, waiting=1, drafted=300, accepted=150),
                _sample(30, running=0, kv=0.1, waiting=0, drafted=600, accepted=450),
            )
        ),
        new_event(BlobRedacted(blob_hash=secret.hash, reason="test"), stream=f"blob-{secret.hash}"),
    )
    async with database.engine.begin() as conn:
        assert await redact_blob(conn, secret.hash)
    await catch_up_all(database)


WIDE_RUNS = ("wide-a", "wide-b")
"""Two runs of a few calls with huge token counts (seed_wide_ledger)."""


async def seed_wide_ledger(database: Database) -> None:
    """Numbers as wide as a real ledger's: ~1.5 M output tok/s, billions of input tokens a day, TTFT
    ~250 ms beside a TPOT of ~0.002 ms. The charts' axes must show every digit of them."""
    events = []
    for r, run in enumerate(WIDE_RUNS):
        for i in range(4):
            t0 = r * 86_400 + i
            call = f"{run}-{i}"
            events.append(started(call, t0, run=run, ticker=f"T{i}", model=f"big-{run}"))
            done = finished(call, t0, t0 + 10, prompt=900_000_000, completion=5_000_000 - r, ttft=0.2 + 0.1 * r)
            events.append(done)
        events.append(new_event(RunAnnotated(run=run, labels={"hardware": f"gpu-{r}"}), stream=f"run-{run}"))
    await append(database, *events)
    await catch_up_all(database)


BUSY_RUN = "busy"
BUSY_TICKERS = 20
BUSY_CALLS = 130
BUSY_STREAMED = BUSY_CALLS // 2
"""`busy`: 130 calls over 20 tickers (5 to 8 each), every even call streamed (token times), the odd ones not."""
ERA_RUNS = 12
"""`era-0` … `era-11`: a call a day, each under a long model name (many wide labels on the x axes)."""
FAILED_RUN = "broken"
FAILED_CALLS = 3
"""`broken`: every call failed."""


def _unstreamed(call_id: str, t0: float, t1: float) -> NewEvent:
    """A call answered in one piece: no first or last token time, so no TTFT or TPOT."""
    event = finished(call_id, t0, t1, completion=150)
    body = event.body
    assert isinstance(body, CallFinished)
    timings = Timings(received=at(t0), upstream_headers=at(t0 + 0.1), finished=at(t1))
    return msgspec.structs.replace(event, body=msgspec.structs.replace(body, timings=timings))


async def seed_busy_ledger(database: Database) -> None:
    """Many categories and long labels, for the dashboard on a narrow screen, and a run whose calls all failed."""
    events = []
    for i in range(BUSY_CALLS):
        t0 = 2.0 * i
        ticker = f"TICKER-{i % BUSY_TICKERS:02d}" if i < 100 else f"TICKER-{i % 10:02d}"
        events.append(started(f"busy-{i}", t0, run=BUSY_RUN, ticker=ticker, model="qwen3-30b-a3b-instruct"))
        if i % 2 == 0:
            events.append(finished(f"busy-{i}", t0, t0 + 6, completion=150, ttft=0.1 + 0.01 * (i % 7)))
        else:
            events.append(_unstreamed(f"busy-{i}", t0, t0 + 6))
    for r in range(ERA_RUNS):
        t0 = 86_400.0 * (r + 2)
        call = f"era-{r}-0"
        events.append(started(call, t0, run=f"era-{r}", ticker="AAPL", model=f"model-family-{r}-instruct-fp8"))
        events.append(finished(call, t0, t0 + 5, prompt=50_000_000 + r, completion=7_000_000 + r))
    for i in range(FAILED_CALLS):
        t0 = 86_400.0 * 20 + i
        events.append(started(f"broken-{i}", t0, run=FAILED_RUN, ticker="AAPL", model="qwen3-30b-a3b-instruct"))
        events.append(failed(f"broken-{i}", t0, t0 + 1))
    await append(database, *events)
    await catch_up_all(database)
