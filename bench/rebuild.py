"""Benchmark: full rebuild of the calls projection vs a plain scan of the events table.

    .venv/bin/python bench/rebuild.py --calls 1000000 [--db sqlite:///bench.db] [--keep] [--gaps N] [--no-scan]
                                      [--workers N] [--phases]

Generates `calls` gateway-shaped calls (call.started + call.finished = 2 events each, 14 in flight)
unless the database already holds them (--keep reuses it); with `--gaps N` each call.finished names
a blob of N chunk gaps (`chunk_gaps_blob`), appended with it as the gateway does; with `--spec-blocks`
each carries vLLM's per-request `metrics` block with its `speculative_decoding` part (what
`--enable-per-request-metrics --per-request-spec-decode-metrics summary` sends). Then times:

- scan (iter_events): every event through the ledger's reader (what any consumer must pay);
- scan (raw columns): SELECT position, type, payload over the whole table (both skipped with `--no-scan`);
- rebuild: `rebuild_projection("calls")` from position 0 into a new version (the follower's fold over
  every event, pages by position range, rows written a page at a time), digest, promote; its wall
  seconds and CPU seconds (this process's threads and its children: on a shared box the CPU time says
  what the work cost when the wall time says how long others made it wait);

and peak RSS: of this process, and of the largest child process (half of a big SQLite digest is
encoded by a child). Prints the digest (equal events give an equal digest, however the rows were
built), each stage's wall and CPU seconds (folding, digest and promotion, removal of the old version)
and a Markdown row for docs/BENCHMARKS.md.

On PostgreSQL the calls read model is vacuumed first (not timed): the state autovacuum keeps it in,
where a server without it would be timed on the dead rows of every earlier rebuild of a `--keep`
database.

`--phases`, instead of the rebuild: the fold path's parts one after another in this process, over the
rebuild's own pages (50,000 events) into a scratch version removed afterwards, each timed alone: reading
a page (`engine.read_page`), decoding it (`call_fold.decode_calls`), folding it (`call_fold.fold_calls`),
the rows' write with their conversion to the driver's parameters (`engine.write_rows`, one transaction a page), in
µs per call. What a rebuild in one process costs when nothing runs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import select

from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, PreparedBlob
from usage_ledger.ledger.chunk_gaps import encode_chunk_gaps
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallFinished, CallStarted, NewEvent, Timings, Usage, new_event
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.read import head_position, iter_events
from usage_ledger.ledger.schema import events
from usage_ledger.projections.call_fold import decode_calls, fold_calls
from usage_ledger.projections.engine import projection_named, read_page, write_rows
from usage_ledger.projections.rebuild import drop_version, rebuild_projection

T0 = datetime(2026, 3, 1, 13, 0, tzinfo=UTC)


def _request_metrics(i: int) -> dict[str, Any]:
    """vLLM 0.32's per-request block of a 1,470-token MTP call (acceptance ≈ 50 %, 3 drafts a step)."""
    steps = 700 + i % 50
    accepted = 1_470 - steps
    return {
        "time_to_first_token_ms": 1_300.0 + i % 200,
        "generation_time_ms": 22_500.0,
        "queue_time_ms": 0.4,
        "mean_itl_ms": 15.3,
        "tokens_per_second": 61.2,
        "speculative_decoding": {
            "mean_acceptance_length": 1 + accepted / steps,
            "draft_acceptance_rate": accepted / (3 * steps),
            "acceptance_histogram": [steps // 3, steps // 3, steps // 6, steps - steps // 3 * 2 - steps // 6],
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": 3 * steps,
            "num_spec_tokens": 3,
        },
    }


def _batch(
    first: int, count: int, gaps: int, spec_blocks: bool, compressor: BlobCompressor
) -> tuple[list[NewEvent], list[PreparedBlob]]:
    out: list[NewEvent | tuple[int, NewEvent]] = []
    blobs: list[PreparedBlob] = []
    for i in range(first, first + count):
        lane, slot = i % 14, i // 14
        t0 = T0 + timedelta(seconds=slot * 25.0 + lane * 0.01)
        t1 = t0 + timedelta(seconds=24.0)
        cid = f"bench-{i:08d}"
        run = f"night-{i // 1700:05d}"
        start = CallStarted(
            call_id=cid,
            received_at=t0,
            method="POST",
            path="/v1/chat/completions",
            run=run,
            tags={"ticker": f"T{(i % 1700) // 17:03d}"},
            model="moe",
            stream=True,
        )
        timings = Timings(
            received=t0,
            upstream_headers=t0 + timedelta(seconds=0.2),
            first_token=t0 + timedelta(seconds=1.5),
            last_token=t1 - timedelta(seconds=0.01),
            finished=t1,
        )
        usage = Usage(prompt_tokens=10_800 + i % 97, completion_tokens=1_470 + i % 31, total_tokens=12_270)
        # a streamed call's inter-chunk gaps as the gateway records them (µs, around 15 ms each), the
        # first one distinct per call so that every call has a blob of its own, as recorded ones do
        gaps_blob: str | None = None
        if gaps:
            chunk_gaps = [10_000 + i, *(15_000 + (i * 7 + k * 13) % 900 for k in range(1, gaps))]
            prepared = compressor.prepare(encode_chunk_gaps(chunk_gaps))
            assert prepared is not None
            blobs.append(prepared)
            gaps_blob = prepared.hash
        finish = CallFinished(
            call_id=cid,
            status=200,
            usage=usage,
            usage_source="reported",
            timings=timings,
            chunk_gaps_blob=gaps_blob,
            request_metrics=_request_metrics(i) if spec_blocks else None,
        )
        out.append(new_event(start, stream=f"call-{cid}", occurred_at=t0))
        out.append((i, new_event(finish, stream=f"call-{cid}", occurred_at=t1)))
    # finishes land 14 calls later, like overlapping calls do
    starts = [e for e in out if not isinstance(e, tuple)]
    finishes = [e[1] for e in out if isinstance(e, tuple)]
    merged: list[NewEvent] = []
    for k, s in enumerate(starts):
        merged.append(s)
        if k >= 14:
            merged.append(finishes[k - 14])
    merged.extend(finishes[max(0, len(starts) - 14) :])
    return merged, blobs


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--db", default="sqlite:///bench-rebuild.db")
    parser.add_argument("--keep", action="store_true", help="reuse an existing database of the same size")
    parser.add_argument(
        "--workers", type=int, default=1, help="the rebuild's worker processes (`ledger rebuild --workers`)"
    )
    parser.add_argument(
        "--gaps", type=int, default=0, help="chunk gaps in each call.finished's gap blob (a 1,470-chunk stream: 1469)"
    )
    parser.add_argument(
        "--spec-blocks", action="store_true", help="each call.finished carries vLLM's per-request block"
    )
    parser.add_argument("--no-scan", action="store_true", help="time the rebuild only, not the two scans")
    parser.add_argument("--phases", action="store_true", help="time the fold path's parts alone, not the rebuild")
    args = parser.parse_args()
    if args.db.startswith("sqlite:///") and not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(args.db[len("sqlite:///") :] + suffix).unlink(missing_ok=True)
    database = open_database(args.db)
    await upgrade_database(database)
    async with database.engine.connect() as conn:
        head = await head_position(conn)
    if head < 2 * args.calls:
        t = time.perf_counter()
        chunk = 10_000
        compressor = BlobCompressor()
        for first in range(head // 2, args.calls, chunk):
            batch, blobs = _batch(first, min(chunk, args.calls - first), args.gaps, args.spec_blocks, compressor)
            await append_events(database, batch, blobs)
        print(f"generated {2 * args.calls:,} events in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    async with database.engine.connect() as conn:
        head = await head_position(conn)

    scan = raw = float("nan")
    n = m = 0
    if not args.no_scan:
        scan, n = await _scan(database)
        raw, m = await _scan_raw(database)

    if database.backend == "postgresql":
        await _vacuumed(database)

    if args.phases:
        await _phases(database, head)
        await database.dispose()
        return
    stages: list[tuple[str, float, float]] = []

    def stage(text: str) -> None:
        stages.append((text, time.perf_counter(), _cpu_seconds()))

    t, cpu = time.perf_counter(), _cpu_seconds()
    promoted = await rebuild_projection(database, "calls", workers=args.workers, stage=stage)
    rebuild, rebuild_cpu = time.perf_counter() - t, _cpu_seconds() - cpu
    stage("end")
    for (text, wall0, cpu0), (_, wall1, cpu1) in itertools.pairwise(stages):
        print(f"  {text}: wall {wall1 - wall0:.1f} s, CPU {cpu1 - cpu0:.1f} s", file=sys.stderr)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    await database.dispose()
    backend = database.backend
    print(f"events {head:,} (scanned {n:,}/{m:,}); digest {promoted.digest[:12]}", file=sys.stderr)
    print(
        "| backend | calls | events | scan iter_events s | scan raw s | rebuild s | rebuild CPU s | rebuild/scan "
        "| rebuild/raw | peak RSS MB | peak RSS child MB |"
    )
    print(
        f"| {backend} | {args.calls:,} (workers {args.workers}) | {head:,} | {scan:.1f} | {raw:.1f} | {rebuild:.1f} | {rebuild_cpu:.1f} | "
        f"{rebuild / scan:.2f} | {rebuild / raw:.2f} | {rss_mb:.0f} | {child_rss_mb:.0f} |"
    )


async def _vacuumed(database: Database) -> None:
    """VACUUM the calls read model before it is timed (PostgreSQL): the state autovacuum, on by default, keeps
    it in. Each rebuild deletes the version it replaces; on a server with autovacuum off those rows stay dead,
    and a database rebuilt again and again (`--keep`) would be timed on all of them."""
    t = time.perf_counter()
    async with database.engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        dead = await driver.fetchval("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'projection_calls'")
        await driver.execute("VACUUM projection_calls")  # asyncpg runs it outside a transaction
    print(f"vacuumed projection_calls ({dead or 0:,} dead rows) in {time.perf_counter() - t:.1f} s", file=sys.stderr)


async def _phases(database: Database, head: int, page_size: int = 50_000) -> None:
    projection = projection_named("calls")
    version = 1_000_000  # a scratch version, far above any a rebuild makes
    async with database.engine.begin() as conn:
        await drop_version(conn, "calls", version)
    spent = dict.fromkeys(("read", "decode", "fold", "write"), 0.0)
    clock = time.perf_counter()

    def lap(part: str) -> None:
        """The time since the last lap goes to `part`."""
        nonlocal clock
        now = time.perf_counter()
        spent[part] += now - clock
        clock = now

    unwritten: dict[str, Any] = {}
    calls: set[str] = set()
    try:
        for after in range(0, head, page_size):
            clock = time.perf_counter()
            page = await read_page(database, after, min(after + page_size, head))
            lap("read")
            events_, continuing = decode_calls(page)
            lap("decode")
            rows = fold_calls(events_, {c: unwritten[c] for c in continuing if c in unwritten}, version)
            lap("fold")
            unwritten = {r.call_id: r for r in rows}
            calls.update(unwritten)
            clock = time.perf_counter()
            await write_rows(database, projection, version, rows)
            lap("write")
    finally:
        async with database.engine.begin() as conn:
            await drop_version(conn, "calls", version)
    print(f"{len(calls):,} calls; wall µs per call of each part, run alone (read and write: the database's work in it)")
    for part, seconds in spent.items():
        print(f"  {part}: {seconds / max(len(calls), 1) * 1e6:.1f}")


async def _scan(database: Database) -> tuple[float, int]:
    t = time.perf_counter()
    n = 0
    async for _ in iter_events(database, 0, 20_000):
        n += 1
    return time.perf_counter() - t, n


async def _scan_raw(database: Database) -> tuple[float, int]:
    t = time.perf_counter()
    m, after = 0, 0
    while True:
        async with database.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(events.c.position, events.c.type, events.c.payload)
                    .where(events.c.position > after)
                    .order_by(events.c.position)
                    .limit(20_000)
                )
            ).all()
        if not rows:
            break
        m += len(rows)
        after = rows[-1][0]
    return time.perf_counter() - t, m


def _cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    asyncio.run(main())
