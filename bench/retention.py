"""Benchmark: erasing the bodies of a year of calls (`ledger redact --before`, `ledger serve --keep-bodies`).

    .venv/bin/python bench/retention.py --calls 100000 [--db sqlite:///bench-retention.db] [--keep] [--vacuum]

Generates `calls` gateway-shaped calls spread evenly over 365 days (the user's year: 1.9M calls, DESIGN §7),
each with its own request body of `--prompt-kb` (default 50 KB: a 12.7k-token prompt as text) and response
body of `--answer-kb` (default 6 KB: 1.47k tokens as a JSON answer), zstd-compressed as the gateway stores
them, unless the database already holds them (--keep reuses it). The text is words drawn from a fixed
vocabulary, so zstd gives it about the ratio prose gets. Then times `commands.retention.erase_selected`
for every call before the last day + 1 (all the bodies: the projections are caught up first, untimed), and
with `--vacuum` the space given back (`ledger redact --vacuum`). Prints the figures, the linear
extrapolation to 1.9M calls and a Markdown row for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select

from usage_ledger.answers import BodySelection
from usage_ledger.commands.retention import erase_selected
from usage_ledger.ledger import append_events, open_database, reclaim_space, upgrade_database
from usage_ledger.ledger.blobs import BlobCompressor, PreparedBlob
from usage_ledger.ledger.events import CallFinished, CallStarted, NewEvent, Timings, Usage, new_event
from usage_ledger.ledger.read import head_position
from usage_ledger.ledger.schema import blobs
from usage_ledger.projections import catch_up_all

T0 = datetime(2025, 12, 1, 0, 0, tzinfo=UTC)
YEAR_CALLS = 1_900_000
_BATCH = 250


def _corpus(size: int) -> str:
    rng = random.Random(55)
    vocabulary = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10))) for _ in range(4000)]
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(vocabulary)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def _batch(
    first: int, count: int, calls: int, corpus: str, prompt: int, answer: int, compressor: BlobCompressor
) -> tuple[list[NewEvent], list[PreparedBlob]]:
    out: list[NewEvent] = []
    stored: list[PreparedBlob] = []
    step = timedelta(days=365) / calls
    for i in range(first, first + count):
        t0 = T0 + step * i
        t1 = t0 + timedelta(seconds=24)
        cid = f"ret-{i:08d}"
        offset = (i * 7919) % (len(corpus) - prompt - answer)
        request = (
            f'{{"model":"moe","messages":[{{"role":"user","content":"{cid} {corpus[offset : offset + prompt]}"}}]}}'
        )
        response = (
            f'{{"id":"{cid}","choices":[{{"index":0,"message":{{"role":"assistant","content":"'
            f'{corpus[offset + prompt : offset + prompt + answer]}"}},"finish_reason":"stop"}}]}}'
        )
        hashes = []
        for data in (request.encode(), response.encode()):
            prepared = compressor.prepare(data)
            assert prepared is not None
            stored.append(prepared)
            hashes.append(prepared.hash)
        start = CallStarted(
            call_id=cid,
            received_at=t0,
            method="POST",
            path="/v1/chat/completions",
            run=f"night-{i // 1700:05d}",
            tags={"ticker": f"T{(i % 1700) // 17:03d}"},
            request_blob=hashes[0],
            model="moe",
        )
        finish = CallFinished(
            call_id=cid,
            status=200,
            response_blob=hashes[1],
            usage=Usage(prompt_tokens=12_700, completion_tokens=1_470, total_tokens=14_170),
            usage_source="reported",
            timings=Timings(received=t0, finished=t1),
        )
        out += [
            new_event(start, stream=f"call-{cid}", occurred_at=t0),
            new_event(finish, stream=f"call-{cid}", occurred_at=t1),
        ]
    return out, stored


async def _stored(database_url: str) -> tuple[int, int, int]:
    database = open_database(database_url, null_pool=True)
    try:
        async with database.engine.connect() as conn:
            head = await head_position(conn)
            count, size = (
                await conn.execute(select(func.count(), func.coalesce(func.sum(blobs.c.stored_size), 0)))
            ).one()
        return head, int(count), int(size)
    finally:
        await database.dispose()


def _file_size(url: str) -> str:
    if not url.startswith("sqlite:///"):
        return "-"
    path = Path(url.removeprefix("sqlite:///"))
    total = sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())
    return f"{total / 1e6:,.0f} MB"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--db", default="sqlite:///bench-retention.db")
    parser.add_argument("--keep", action="store_true", help="reuse the database if it holds the calls")
    parser.add_argument("--prompt-kb", type=float, default=50.0)
    parser.add_argument("--answer-kb", type=float, default=6.0)
    parser.add_argument("--vacuum", action="store_true", help="then time the space given back")
    args = parser.parse_args()

    database = open_database(args.db)
    try:
        await upgrade_database(database)
        async with database.engine.connect() as conn:
            head = await head_position(conn)
        if head == 0 or not args.keep:
            if head:
                raise SystemExit(f"{args.db} holds {head} events: pass --keep to reuse it, or another database")
            corpus = _corpus(4_000_000)
            compressor = BlobCompressor()
            started = time.perf_counter()
            for first in range(0, args.calls, _BATCH):
                batch, stored = _batch(
                    first,
                    min(_BATCH, args.calls - first),
                    args.calls,
                    corpus,
                    int(args.prompt_kb * 1000),
                    int(args.answer_kb * 1000),
                    compressor,
                )
                await append_events(database, batch, stored)
            print(f"generated {args.calls:,} calls in {time.perf_counter() - started:.1f} s")
        await catch_up_all(database)
    finally:
        await database.dispose()

    head, count, size = await _stored(args.db)
    print(f"ledger: {head:,} events, {count:,} bodies, {size / 1e6:,.0f} MB stored, file {_file_size(args.db)}")

    database = open_database(args.db)
    try:
        before = T0 + timedelta(days=366)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        done = await erase_selected(database, BodySelection(before=before), "bench: retention")
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        vacuum_s = None
        if args.vacuum:
            v0 = time.perf_counter()
            await reclaim_space(database)
            vacuum_s = time.perf_counter() - v0
    finally:
        await database.dispose()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    head_after, _, size_after = await _stored(args.db)
    per_call = wall / max(done.calls, 1)
    print(
        f"erased {done.bodies:,} bodies of {done.calls:,} calls ({done.stored_bytes / 1e6:,.0f} MB stored) in "
        f"{wall:.1f} s wall, {cpu:.1f} s CPU (this process), peak RSS {rss_mb:.0f} MB; "
        f"{done.already_erased:,} erased before; {head_after - head:,} events appended"
    )
    if vacuum_s is not None:
        print(f"space given back in {vacuum_s:.1f} s: file {_file_size(args.db)}, {size_after / 1e6:,.0f} MB stored")
    year = per_call * YEAR_CALLS
    print(f"extrapolated to {YEAR_CALLS:,} calls (linear): {year / 60:.1f} min")
    print(
        f"| erase a year of bodies, {args.db.split(':')[0]}, {done.calls:,} calls | `bench/retention.py --calls "
        f"{args.calls} --db …{' --vacuum' if args.vacuum else ''}` | 1 | **{wall:.1f} s** wall, {cpu:.1f} s CPU, "
        f"{done.bodies:,} bodies ({done.stored_bytes / 1e6:,.0f} MB stored); 1.9M calls ≈ {year / 60:.0f} min "
        f"(extrapolated){'' if vacuum_s is None else f'; VACUUM {vacuum_s:.1f} s'} |"
    )


if __name__ == "__main__":
    asyncio.run(main())
