"""Rebuilds: same digest as incremental application and as the bulk (SQL) load (properties), promotion,
status, formulas."""

from __future__ import annotations

import itertools
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select

from tests.projections.helpers import append, append_plain_calls, at, failed, finished, spec_metrics, started
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import (
    CallFailed,
    CallFinished,
    CallImported,
    CallRetagged,
    CallStarted,
    NewEvent,
    ProjectionPromoted,
    RunAnnotated,
    Timings,
    Usage,
    new_event,
    utc_now,
)
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.read import head_position, iter_events
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections._bulk import insert_plain_calls, prepare_calls
from usage_ledger.projections.calls import _sqlite_digest, rows_digest
from usage_ledger.projections.engine import PROJECTIONS, catch_up, projection_status
from usage_ledger.projections.rebuild import load_version, rebuild_projection, set_formula
from usage_ledger.projections.reports import recompute_report, runs_report
from usage_ledger.projections.tables import calls

_serial = itertools.count()


def _request_metrics(n: int) -> dict[str, Any] | None:
    """A call's `request_metrics` by `n`: none, a block the calls read model keeps, or one it must not."""
    kept = spec_metrics(n, n // 2, n // 3)
    odd: list[Any] = [True, 3.0, -1, 10**15, "5", None]
    if n % 4 == 0:
        return None
    if n % 4 == 1:
        return kept
    if n % 4 == 2:
        return {"speculative_decoding": None} if n % 3 == 0 else {"mean_itl_ms": 1.5}
    block = dict(kept["speculative_decoding"])
    block[("num_draft_tokens", "num_accepted_draft_tokens", "num_spec_steps")[n % 3]] = odd[n % len(odd)]
    return {"speculative_decoding": block if n % 7 else [1, 2]}


def _event(kind: str, call: int, t: float, n: int, salt: int) -> NewEvent:
    cid = f"c{salt}-{call}"
    if kind == "started":
        return started(cid, t, run=("r1", "r2", None)[n % 3], ticker=f"T{n % 4}")
    if kind == "finished":
        return finished(cid, t, t + 1 + n % 7, completion=n, prompt=n * 3, request_metrics=_request_metrics(n))
    if kind == "failed":
        return failed(cid, t, t + 2)
    if kind == "started_odd":  # offsets, whole seconds, several tags, escapes, no model
        received = at(t).astimezone(timezone(timedelta(hours=2))) if n % 3 == 0 else at(float(int(t)))
        tags = {"ticker": f"T{n % 4}", 'b"q': "\u00fc\n", "a": "x"} if n % 2 else {"z": "1", "a": "2\u00e9"}
        body3 = CallStarted(
            call_id=cid,
            received_at=received,
            method="POST",
            path="/v1/chat/completions",
            tags=tags,
            model=None if n % 5 == 0 else "m",
            request_blob=f"b{n}",
        )
        return new_event(body3, stream=f"call-{cid}")
    if kind == "finished_odd":  # error statuses, no or cached usage, missing or equal moments
        t0 = at(float(int(t))) if n % 2 else at(t)
        moments = Timings(
            received=t0,
            first_token=t0 if n % 4 == 0 else None if n % 4 == 1 else t0 + timedelta(microseconds=n),
            last_token=None if n % 4 == 1 else t0 + timedelta(microseconds=n * (n % 3)),
            finished=None if n % 3 == 0 else t0 + timedelta(seconds=n / 7),
        )
        usage = (
            None if n % 3 == 0 else Usage(prompt_tokens=n % 2, completion_tokens=n % 4, total_tokens=0, cached_tokens=n)
        )
        if n % 5 == 0:
            return new_event(
                CallFailed(call_id=cid, phase="body", reason="client_disconnected", usage=usage, timings=moments),
                stream=f"call-{cid}",
            )
        status = (500, 302, 200, 404)[n % 4]
        body4 = CallFinished(
            call_id=cid,
            status=status,
            usage=usage,
            usage_source="reported" if usage else "absent",
            response_blob=f"r{n}",
            timings=moments,
            request_metrics=_request_metrics(n + 1),
        )
        return new_event(body4, stream=f"call-{cid}")
    if kind == "imported":
        body = CallImported(
            call_id=cid,
            source="s",
            line=n,
            started_at=at(t),
            finished_at=at(t) + timedelta(seconds=n % 5),
            input_tokens=n,
            output_tokens=n // 2,
            run="imp" if n % 2 else None,
            tags={"ticker": f"T{n % 3}"},
        )
        return new_event(body, stream=f"call-{cid}")
    if kind == "retagged":
        body2 = CallRetagged(
            call_id=cid, reason="fix", run=f"x{n % 2}", tags={"k": str(n)}, removed_tags=["ticker"] if n % 2 else []
        )
        return new_event(body2, stream=f"call-{cid}")
    return new_event(
        RunAnnotated(labels={"hw": f"h{n}"}, run="r1" if n % 2 else None, start=at(t) if n % 2 == 0 else None),
        stream="run-x",
    )


_kinds = st.sampled_from(["started", "started", "finished", "finished", "failed", "imported", "retagged", "annotated"])
_times = st.floats(0, 5000, allow_nan=False)
_events = st.lists(st.tuples(_kinds, st.integers(0, 5), _times, st.integers(0, 100)), min_size=1, max_size=40)
# for the bulk load: plain calls (a start, then at most one end, `lag` events later) with every
# kind of exception mixed in at random places (repeats, retags, imports, ends before starts)
_plain_calls = st.lists(
    st.tuples(
        st.sampled_from(["started", "started", "started_odd"]),
        st.sampled_from([None, "finished", "finished_odd", "finished_odd", "failed"]),
        st.one_of(_times, st.integers(0, 5000).map(float)),
        st.integers(0, 100),
        st.integers(0, 4),
    ),
    min_size=1,
    max_size=30,
)
_extras = st.lists(
    st.tuples(_kinds | st.just("finished_odd"), st.integers(0, 35), _times, st.integers(0, 100)), max_size=10
)


def _bulk_batch(
    plain: list[tuple[str, str | None, float, int, int]], extras: list[tuple[str, int, float, int]], salt: int
) -> list[NewEvent]:
    batch: list[NewEvent] = []
    ends: list[tuple[int, NewEvent]] = []
    for call, (start, end, t, n, lag) in enumerate(plain):
        batch.append(_event(start, call, t, n, salt))
        if end is not None:
            ends.append((len(batch) + lag, _event(end, call, t, n, salt)))
    for at_, ev in reversed(ends):
        batch.insert(min(at_, len(batch)), ev)
    for kind, call, t, n in extras:
        batch.insert((call * 7 + n) % (len(batch) + 1), _event(kind, call, t, n, salt))
    return batch


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_events, splits=st.lists(st.integers(1, 40), max_size=4), page=st.integers(1, 7))
async def test_rebuild_digest_equals_incremental(
    database: Database, spec: list[tuple[str, int, float, int]], splits: list[int], page: int
) -> None:
    salt = next(_serial)
    batch = [_event(kind, call, t, n, salt) for kind, call, t, n in spec]
    version = 100 + 2 * salt
    async with database.engine.begin() as conn:  # both versions start where this example's events begin
        base = await head_position(conn)
        for name in PROJECTIONS:
            for v in (version, version + 1):
                await conn.execute(
                    insert(checkpoints).values(projection=name, version=v, position=base, updated_at=utc_now())
                )
    cuts = sorted({min(s, len(batch)) for s in splits} | {len(batch)})
    start = 0
    for cut in cuts:
        await append(database, *batch[start:cut])
        start = cut
        for name in PROJECTIONS:
            await catch_up(database, name, version, page_size=page)
    for name, projection in PROJECTIONS.items():
        await catch_up(database, name, version + 1)  # one pass, big pages
        async with database.engine.connect() as conn:
            assert await projection.digest(conn, version) == await projection.digest(conn, version + 1), name


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plain=_plain_calls, extras=_extras, splits=st.lists(st.integers(1, 60), max_size=3), page=st.integers(1, 9))
async def test_bulk_load_digest_equals_incremental(
    database: Database,
    plain: list[tuple[str, str | None, float, int, int]],
    extras: list[tuple[str, int, float, int]],
    splits: list[int],
    page: int,
) -> None:
    """`load_version` (SQL for plain calls, the Python fold for the rest) gives the incremental rows."""
    salt = next(_serial)
    batch = _bulk_batch(plain, extras, salt)
    version = 1000 + 2 * salt  # from position 0: earlier examples' events are in both versions
    start = 0
    for cut in sorted({min(s, len(batch)) for s in splits} | {len(batch)}):
        await append(database, *batch[start:cut])
        start = cut
        for name in PROJECTIONS:
            await catch_up(database, name, version, page_size=page)
    async with database.engine.connect() as conn:
        head = await head_position(conn)
    for name, projection in PROJECTIONS.items():
        await load_version(database, name, version + 1, head)
        async with database.engine.connect() as conn:
            assert await projection.digest(conn, version) == await projection.digest(conn, version + 1), name
            checkpoint = await conn.execute(
                select(checkpoints.c.position).where(
                    checkpoints.c.projection == name, checkpoints.c.version == version + 1
                )
            )
            assert checkpoint.scalar_one() == head


async def _plain_calls_inserted(database: Database, head: int, workdir: Path) -> int:
    """How many calls the SQL part of the bulk load takes (inserted into version 7, rolled back)."""
    conn = await database.engine.connect()
    try:
        await prepare_calls(conn, head, workdir)
        async with conn.begin():
            inserted = await insert_plain_calls(conn, 7)
            await conn.rollback()
        return inserted
    finally:
        await conn.invalidate()  # with the work file it attached on SQLite
        await conn.close()


async def test_bulk_load_takes_plain_calls_in_sql_and_stops_at_head(database: Database, tmp_path: Path) -> None:
    await append(
        database,
        started("a", 0, run="r", ticker="T"),
        started("b", 1),
        finished("a", 0, 10, completion=100),
        failed("b", 1, 2),
        started("c", 3),  # incomplete
        started("d", 4),
        finished("d", 4, 5),
        finished("d", 4, 6),  # a repeated end: folded in Python
    )
    async with database.engine.connect() as conn:
        head = await head_position(conn)
    await append(database, started("late", 9), finished("a", 0, 11))  # after the captured head
    assert await _plain_calls_inserted(database, head, tmp_path) == 3  # a, b, c
    await load_version(database, "calls", 8, head)
    await catch_up(database, "calls", 9)
    calls_projection = PROJECTIONS["calls"]
    async with database.engine.connect() as conn:
        loaded = [r.call_id for r in await conn.execute(select(calls.c.call_id).where(calls.c.version == 8))]
        assert sorted(loaded) == ["a", "b", "c", "d"]
    assert await catch_up(database, "calls", 8) == head + 2  # the rest through the incremental path
    async with database.engine.connect() as conn:
        assert await calls_projection.digest(conn, 8) == await calls_projection.digest(conn, 9)


async def test_rebuild_promotes_and_records(database: Database) -> None:
    await append(database, started("a", 0, run="r"), finished("a", 0, 10, completion=100))
    before = await runs_report(database)
    promoted = await rebuild_projection(database, "calls")
    assert promoted.version == 2 and promoted.formula == "batch_aggregate" and len(promoted.digest) == 64
    stored = [e.body() async for e in iter_events(database)]
    assert stored[-1] == promoted and isinstance(stored[-1], ProjectionPromoted)
    assert await runs_report(database) == before
    async with database.engine.connect() as conn:
        versions = (
            await conn.execute(select(checkpoints.c.version).where(checkpoints.c.projection == "calls"))
        ).scalars()
        assert list(versions) == [2]  # the old version was dropped after promotion
    status = {s.name: s for s in await projection_status(database)}
    assert status["calls"].live and status["calls"].version == 2 and status["calls"].digest == promoted.digest
    again = await rebuild_projection(database, "calls")
    assert again.digest == promoted.digest and again.version == 3


async def test_formula_promotion_and_recompute(database: Database) -> None:
    await append(
        database,
        started("a", 0, run="r"),
        finished("a", 0, 10, completion=100),
        started("b", 0, run="r"),
        finished("b", 0, 20, completion=100),
    )
    rows = await recompute_report(database, "per_call_mean")
    assert rows[0].old_tps == 200 / 20 and rows[0].new_tps == (10 + 5) / 2
    await set_formula(database, "per_call_mean")
    (row,) = await runs_report(database)
    assert row.formula == "per_call_mean" and row.throughput_tps == 7.5


async def test_bulk_load_folds_every_unusual_call(database: Database, tmp_path: Path) -> None:
    """Only the plain call goes through SQL; imports, retags, orphan, early, repeated events reach the fold."""
    imported = CallImported(
        call_id="imp", source="s", line=1, started_at=at(0), finished_at=at(5), input_tokens=10, output_tokens=5
    )
    await append(
        database,
        started("plain", 0, run="r", ticker="T"),
        new_event(imported, stream="call-imp"),
        finished("plain", 0, 3),
        finished("imp", 0, 6),  # an end after an import
        finished("orphan", 1, 2),  # an end without a start
        started("late", 2),
        finished("late", 2, 4),
        new_event(CallRetagged(call_id="late", reason="fix", run="r2", tags={"ticker": "U"}), stream="call-late"),
        finished("early", 3, 4),  # the end before the start
        started("early", 3),
        started("twice", 4),
        started("twice", 5),  # a repeated start
        finished("twice", 5, 6),
        started("ends", 6),
        finished("ends", 6, 7),
        finished("ends", 6, 8),  # a repeated end
    )
    assert await _bulk_load_matches_the_fold(database, tmp_path, plain=1) == [
        "early",
        "ends",
        "imp",
        "late",
        "orphan",
        "plain",
        "twice",
    ]


async def test_bulk_load_finds_an_end_without_a_start_among_plain_calls(database: Database, tmp_path: Path) -> None:
    """No repeated start to give it away: the orphan end is found by counting the ends every row took."""
    await append(
        database,
        started("a", 0),
        finished("a", 0, 1),
        finished("orphan", 1, 2),
        started("b", 2),
        finished("b", 2, 3),
        started("open", 3),
    )
    assert await _bulk_load_matches_the_fold(database, tmp_path, plain=3) == ["a", "b", "open", "orphan"]


async def _bulk_load_matches_the_fold(database: Database, tmp_path: Path, *, plain: int) -> list[str]:
    """Bulk-load every event into version 42 (`plain` calls in SQL), fold them into 41; the call ids loaded."""
    async with database.engine.connect() as conn:
        head = await head_position(conn)
    assert await _plain_calls_inserted(database, head, tmp_path) == plain
    await catch_up(database, "calls", 41)
    await load_version(database, "calls", 42, head)
    calls_projection = PROJECTIONS["calls"]
    async with database.engine.connect() as conn:
        assert await calls_projection.digest(conn, 41) == await calls_projection.digest(conn, 42)
        loaded = (await conn.execute(select(calls.c.call_id).where(calls.c.version == 42))).scalars()
        return sorted(loaded)


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)  # PostgreSQL's digest is `rows_digest` itself
async def test_digest_equals_the_digest_of_typed_rows(database: Database) -> None:
    """The SQLite digest (datetimes rewritten in SQL) is the digest of the rows as SQLAlchemy types them,
    also for stored datetimes in another shape and text with a NUL in it, also split over two processes."""
    await append(
        database,
        started("a", 0, run="r", ticker="T"),
        finished("a", 0, 10.25),
        started("b", 1.5),
        failed("c", 2, 3),
    )
    await catch_up(database, "calls")
    version = 1  # the live version, never rebuilt
    async with database.engine.begin() as conn:
        await conn.exec_driver_sql("UPDATE projection_calls SET started_at = '2026-03-02 12:00:01' WHERE call_id = 'b'")
        await conn.exec_driver_sql(
            "UPDATE projection_calls SET tags = '{\"k\":\"' || char(0) || '\"}' WHERE call_id = 'a'"
        )
    async with database.engine.connect() as conn:
        rows = (await conn.execute(select(calls.c.call_id, calls.c.started_at).where(calls.c.version == version))).all()
        assert len(rows) == 3
        assert await PROJECTIONS["calls"].digest(conn, version) == await rows_digest(conn, version)
        # the same with the upper half ('b', 'c') encoded by the child process
        assert await _sqlite_digest(conn, version, child_from=1) == await rows_digest(conn, version)


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)
async def test_dropping_a_version_leaves_the_connection_as_it_was(database: Database) -> None:
    await append(database, started("a", 0), finished("a", 0, 1))
    await catch_up(database, "calls")
    async with database.engine.begin() as conn:
        before = (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one()
        await PROJECTIONS["calls"].table.drop(conn, 1)
        assert (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one() == before
        assert (await conn.execute(select(calls.c.call_id).where(calls.c.version == 1))).first() is None


async def test_a_sqlite_rebuild_reports_progress_while_its_scans_read_the_ledger(tmp_path: Path) -> None:
    """The bulk load's scans run in a child process for most of a large rebuild; their progress
    reaches the caller (the bar of `ledger rebuild`) as it goes, not only once they are done."""
    database = open_database(f"sqlite:///{tmp_path / 'ledger.db'}")
    await upgrade_database(database)
    try:
        calls = 1_500  # 3,000 positions: the scans call out at positions 1,024 and 2,048
        await append_plain_calls(database, calls)
        seen: list[tuple[int, int]] = []
        steps: list[str] = []
        promoted = await rebuild_projection(
            database, "calls", progress=lambda done, total: seen.append((done, total)), stage=steps.append
        )
        head = 2 * calls
        assert promoted.head_position == head
        version = promoted.version
        assert steps == [
            "reading events",
            "preparing rows",
            f"writing version {version}",
            "catching up",
            f"digest and promotion of version {version}",
        ]
        scanning = seen[: seen.index((head, head))]
        assert scanning and all(total == head for _, total in scanning)
        assert all(0 < done < head for done, _ in scanning)
        assert [done for done, _ in scanning] == sorted(done for done, _ in scanning)
    finally:
        await database.dispose()
