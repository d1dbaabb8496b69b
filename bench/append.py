"""Append throughput of the ledger, on SQLite and PostgreSQL, batching on.

(a) events without bodies, through the group-commit writer (many producers, one writer);
(b) whole calls with realistic bodies: a ≈43 KB prompt (10.8k tokens of ticker data), the raw SSE
    bytes of a streamed ≈1.47k-token answer, and a second run that re-sends the first run's
    prompts (a re-run batch), so repeated prompts are stored once.

    .venv/bin/python bench/append.py [--pg postgresql://postgres@127.0.0.1:5432/test] [--repeat 3]

Prints a Markdown table (median of --repeat runs); each run uses a fresh database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import blob_hash
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallFinished, CallStarted, NewEvent, Timings, Usage, new_event
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.schema import blobs
from usage_ledger.ledger.writer import EventWriter

T0 = datetime(2026, 11, 30, 21, 0, tzinfo=UTC)
WORDS = [
    *("revenue", "margin", "guidance", "outlook", "growth", "quarter", "demand", "supply", "capex", "dividend"),
    *("buyback", "valuation", "risk", "momentum", "support", "resistance", "volume", "breakout", "earnings"),
    *("consensus", "upgrade", "downgrade", "sector", "rotation"),
]


def prompt_body(ticker: int, step: int) -> bytes:
    """≈43 KB: a shared system prompt, the ticker's price history, the step's instruction."""
    rng = random.Random(ticker)
    rows = []
    price = 50 + rng.random() * 400
    for day in range(330):
        price *= 1 + rng.gauss(0, 0.02)
        rows.append(
            f"2026-{1 + day // 28 % 12:02d}-{1 + day % 28:02d},{price:.2f},{price * 1.01:.2f},"
            f"{price * 0.99:.2f},{price * (1 + rng.gauss(0, 0.005)):.2f},{rng.randint(10**5, 10**8)}"
        )
    system = "You are a careful equity analyst. Answer in Korean and English. " * 40
    user = f"Ticker T{ticker:03d}. Step {step}: analyse the data below.\ndate,open,high,low,close,volume\n" + "\n".join(
        rows
    )
    return (
        b'{"model":"qwen3-moe","stream":true,"temperature":0.8,"max_tokens":4096,"messages":[{"role":"system","content":"'
        + system.encode()
        + b'"},{"role":"user","content":"'
        + user.replace("\n", "\\n").encode()
        + b'"}],"chat_template_kwargs":{"enable_thinking":false}}'
    )


def sse_body(rng: random.Random, tokens: int = 1470) -> bytes:
    """vLLM-shaped SSE: role chunk, ≈2 tokens per chunk (speculative decoding), finish, usage, [DONE]."""
    head = (
        f'{{"id":"chatcmpl-{uuid.uuid4().hex}","object":"chat.completion.chunk","created":1764536400,'
        '"model":"qwen3-moe","choices":['
    )
    out = [
        f'data: {head}{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}}\n\n'
    ]
    for _ in range(tokens // 2):
        text = " ".join(rng.choice(WORDS) for _ in range(2))
        out.append(
            f'data: {head}{{"index":0,"delta":{{"content":" {text}"}},"logprobs":null,"finish_reason":null}}]}}\n\n'
        )
    out.append(
        f'data: {head}{{"index":0,"delta":{{"content":""}},"logprobs":null,"finish_reason":"stop","stop_reason":null}}]}}\n\n'
    )
    out.append(
        f'data: {head}],"usage":{{"prompt_tokens":10800,"total_tokens":12270,"completion_tokens":{tokens}}}}}\n\n'
    )
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def call_events(
    index: int, run: str, request_hash: str | None = None, response_hash: str | None = None
) -> list[NewEvent]:
    call_id = uuid.uuid4().hex
    start = T0 + timedelta(seconds=index)
    stream = f"call-{call_id}"
    started = CallStarted(
        call_id=call_id,
        received_at=start,
        method="POST",
        path="/v1/chat/completions",
        run=run,
        tags={"ticker": f"T{index % 100:03d}"},
        request_blob=request_hash,
        model="qwen3-moe",
        stream=True,
        request_headers=[("content-type", "application/json"), ("authorization", "sha256:1a2b3c4d5e6f")],
    )
    finished = CallFinished(
        call_id=call_id,
        status=200,
        response_blob=response_hash,
        chunk_count=737,
        usage=Usage(prompt_tokens=10800, completion_tokens=1470, total_tokens=12270),
        usage_source="reported",
        finish_reasons=["stop"],
        timings=Timings(received=start, first_token=start, last_token=start, finished=start),
    )
    return [new_event(started, stream=stream, occurred_at=start), new_event(finished, stream=stream, occurred_at=start)]


async def fresh_database(
    backend: str, pg_url: str | None, workdir: Path
) -> tuple[Database, Callable[[], Awaitable[None]]]:
    if backend == "sqlite":
        path = workdir / f"bench-{uuid.uuid4().hex[:8]}.db"
        database = open_database(f"sqlite:///{path}")

        async def drop_sqlite() -> None:
            await database.dispose()
            for suffix in ("", "-wal", "-shm"):
                await asyncio.to_thread(Path(f"{path}{suffix}").unlink, missing_ok=True)

        await upgrade_database(database)
        return database, drop_sqlite
    assert pg_url is not None
    parsed = make_url(pg_url)
    name = f"ledger_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username, database=parsed.database
    )
    await admin.execute(f'CREATE DATABASE "{name}"')
    database = open_database(parsed.set(database=name).render_as_string(hide_password=False))

    async def drop_pg() -> None:
        await database.dispose()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()

    await upgrade_database(database)
    return database, drop_pg


async def bench_events(database: Database, total: int) -> float:
    """Events/s: `total` single-event submissions, 5,000 in flight at a time, one group-commit writer."""
    batches = [call_events(i, "bench")[:1] for i in range(total)]
    async with EventWriter(database, batch_max_events=5000) as writer:
        started = time.perf_counter()
        for start in range(0, total, 5000):
            await asyncio.gather(*(writer.submit(b) for b in batches[start : start + 5000]))
        elapsed = time.perf_counter() - started
    return total / elapsed


async def bench_batches(database: Database, total: int) -> float:
    """Events/s straight through `append_events` in batches of 5,000 (no writer queue, no futures)."""
    events = [e for i in range(total) for e in call_events(i, "bench")[:1]]
    started = time.perf_counter()
    for start in range(0, total, 5000):
        await append_events(database, events[start : start + 5000])
    return total / (time.perf_counter() - started)


async def bench_calls(database: Database, calls_per_run: int, runs: int) -> tuple[float, int, int]:
    """Calls/s with bodies, and (raw bytes, stored bytes)."""
    rng = random.Random(7)
    prompts = [prompt_body(i % 100, i // 100) for i in range(calls_per_run)]
    responses = [sse_body(rng) for _ in range(calls_per_run * runs)]
    raw = 0
    submissions = []
    for run in range(runs):
        for i in range(calls_per_run):
            prompt, response = prompts[i], responses[run * calls_per_run + i]
            p_hash, r_hash = blob_hash(prompt), blob_hash(response)
            raw += len(prompt) + len(response)
            submissions.append((call_events(i, f"run{run}", p_hash, r_hash), {p_hash: prompt, r_hash: response}))
    async with EventWriter(database, batch_max_events=2000) as writer:
        started = time.perf_counter()
        for start in range(0, len(submissions), 200):
            await asyncio.gather(*(writer.submit(e, b) for e, b in submissions[start : start + 200]))
        elapsed = time.perf_counter() - started
    async with database.engine.connect() as conn:
        stored = int((await conn.execute(select(func.coalesce(func.sum(blobs.c.stored_size), 0)))).scalar_one())
    return len(submissions) / elapsed, raw, stored


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pg", default=os.environ.get("TEST_PG_URL"), help="PostgreSQL URL (a database to CREATE DATABASE from)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--calls-per-run", type=int, default=1700)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    backends = ["sqlite"] + (["postgresql"] if args.pg else [])
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        "| backend | (a) events/s, writer, 1 event per submit | (a') events/s, append_events, 5,000 per batch | (b) calls/s with bodies | stored / raw bytes |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            event_rates, batch_rates, call_rates, ratios = [], [], [], []
            for _ in range(args.repeat):
                database, drop = await fresh_database(backend, args.pg, Path(tmp))
                try:
                    event_rates.append(await bench_events(database, args.events))
                finally:
                    await drop()
                database, drop = await fresh_database(backend, args.pg, Path(tmp))
                try:
                    batch_rates.append(await bench_batches(database, args.events))
                finally:
                    await drop()
                database, drop = await fresh_database(backend, args.pg, Path(tmp))
                try:
                    rate, raw, stored = await bench_calls(database, args.calls_per_run, args.runs)
                    call_rates.append(rate)
                    ratios.append(stored / raw)
                finally:
                    await drop()
            print(
                f"| {backend} | {statistics.median(event_rates):,.0f} | {statistics.median(batch_rates):,.0f} "
                f"| {statistics.median(call_rates):,.0f} "
                f"| {statistics.median(ratios):.1%} ({raw / 1e6:,.0f} MB raw → {stored / 1e6:,.1f} MB) |"
            )


if __name__ == "__main__":
    import uvloop  # the loop `ledger serve` runs on

    uvloop.run(main())
