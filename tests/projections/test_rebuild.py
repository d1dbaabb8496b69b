"""Rebuilds: the follower's fold from position 0, promotion, status, formulas, digest, progress."""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import func, select, text, update

from tests.ledger.helpers import migrated
from tests.projections.helpers import append, append_plain_calls, at, failed, finished, started
from usage_ledger.answers.reports import recompute_report, runs_report
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import (
    CallImported,
    CallRetagged,
    ProjectionPromoted,
    new_event,
)
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.read import head_position, iter_events
from usage_ledger.ledger.schema import checkpoints, events, head
from usage_ledger.ledger.sqlite_digest import digest_rows
from usage_ledger.projections.calls import rows_digest
from usage_ledger.projections.engine import PROJECTIONS, catch_up, projection_status
from usage_ledger.projections.rebuild import drop_version, rebuild_projection, set_formula
from usage_ledger.projections.tables import calls


async def test_rebuild_stops_at_no_head_and_equals_the_follower(database: Database) -> None:
    """A rebuild folds what is appended while it runs (position ranges up to the head, then catch-up)."""
    await append(database, started("a", 0, run="r", ticker="T"), started("b", 1), finished("a", 0, 10, completion=100))
    await catch_up(database, "calls", 9, page_size=1)
    await append(database, failed("b", 1, 2), started("late", 9), finished("a", 0, 11))
    promoted = await rebuild_projection(database, "calls", page_size=2)
    await catch_up(database, "calls", 9, page_size=1)
    async with database.engine.connect() as conn:
        assert promoted.head_position == await head_position(conn) - 1  # all but its own promotion
        loaded = (await conn.execute(select(calls.c.call_id).where(calls.c.version == promoted.version))).scalars()
        assert sorted(loaded) == ["a", "b", "late"]
        assert await PROJECTIONS["calls"].digest(conn, 9) == promoted.digest


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


async def test_a_postgresql_rebuild_gives_the_planner_statistics_of_its_rows(fresh_pg_url: str) -> None:
    """The digest reads the new version a page at a time by call id; planned without statistics (a server without
    autovacuum), each page was a scan and sort of the rest of the version. (SQLite plans it on the primary key.)"""
    async with migrated(fresh_pg_url) as database:
        await append(database, started("a", 0, run="r"), finished("a", 0, 10, completion=100))
        await rebuild_projection(database, "calls")
        async with database.engine.connect() as conn:
            analyzed = await conn.scalar(
                text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'projection_calls'")
            )
    assert analyzed is not None


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


async def _append_unusual_calls(database: Database) -> None:
    """Imports, retags, orphan, early and repeated events."""
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


async def test_a_rebuild_folds_every_unusual_call_as_the_follower_does(database: Database) -> None:
    """Imports, retags, orphan, early, repeated events: one page of a rebuild gives the rows of one event a page."""
    await _append_unusual_calls(database)
    await catch_up(database, "calls", 41, page_size=1)
    promoted = await rebuild_projection(database, "calls", keep_old=True)
    async with database.engine.connect() as conn:
        assert await PROJECTIONS["calls"].digest(conn, 41) == promoted.digest
        loaded = (await conn.execute(select(calls.c.call_id).where(calls.c.version == promoted.version))).scalars()
        assert sorted(loaded) == ["early", "ends", "imp", "late", "orphan", "plain", "twice"]


async def test_digest_equals_the_digest_of_typed_rows(database: Database) -> None:
    """The digest (SQLite: datetimes rewritten in SQL; PostgreSQL: asyncpg's values) is the digest of the rows
    as SQLAlchemy types them, also for stored datetimes in another shape and text with a NUL in it, also
    split over two processes on SQLite."""
    await append(
        database,
        started("a", 0, run="r", ticker="T"),
        finished("a", 0, 10.25),
        started("b", 1.5),
        failed("c", 2, 3),
    )
    await catch_up(database, "calls")
    version = 1  # the live version, never rebuilt
    if database.backend == "sqlite":
        async with database.engine.begin() as conn:
            await conn.exec_driver_sql(
                "UPDATE projection_calls SET started_at = '2026-03-02 12:00:01' WHERE call_id = 'b'"
            )
            await conn.exec_driver_sql(
                "UPDATE projection_calls SET tags = '{\"k\":\"' || char(0) || '\"}' WHERE call_id = 'a'"
            )
    async with database.engine.connect() as conn:
        rows = (await conn.execute(select(calls.c.call_id, calls.c.started_at).where(calls.c.version == version))).all()
        assert len(rows) == 3
        assert await PROJECTIONS["calls"].digest(conn, version) == await rows_digest(conn, version)
        if database.backend == "sqlite":  # the same with the upper half ('b', 'c') encoded by the child process
            assert await digest_rows(conn, calls, version, "calls", child_from=1) == await rows_digest(conn, version)


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)
async def test_dropping_a_version_leaves_the_connection_as_it_was(database: Database) -> None:
    await append(database, started("a", 0), finished("a", 0, 1))
    await catch_up(database, "calls")
    async with database.engine.begin() as conn:
        before = (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one()
        await drop_version(conn, "calls", 1)
        assert (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one() == before
        assert (await conn.execute(select(calls.c.call_id).where(calls.c.version == 1))).first() is None


async def test_a_rebuild_reports_its_stages_and_progress(tmp_path: Path) -> None:
    """`ledger rebuild`'s bar: the position of each page applied, against the head, and the stage names."""
    database = open_database(f"sqlite:///{tmp_path / 'ledger.db'}")
    await upgrade_database(database)
    try:
        calls = 1_500
        await append_plain_calls(database, calls)
        seen: list[tuple[int, int]] = []
        steps: list[str] = []
        promoted = await rebuild_projection(
            database,
            "calls",
            page_size=1000,
            progress=lambda done, total: seen.append((done, total)),
            stage=steps.append,
        )
        head = 2 * calls
        assert promoted.head_position == head
        version = promoted.version
        assert steps == [f"folding events into version {version}", f"digest and promotion of version {version}"]
        assert seen == [(1000, head), (2000, head), (head, head)]
    finally:
        await database.dispose()


async def test_workers_fold_what_one_process_folds(database: Database) -> None:
    """`workers=N`: N processes, each a range of the calls' streams, give the rows one process gives,
    with a call's events pages apart (started in one page, retagged and finished in later ones)."""
    await _append_unusual_calls(database)
    await append_plain_calls(database, 120, batch=40)  # starts and ends 40 events apart: several pages of 7
    await append(
        database,
        new_event(CallRetagged(call_id="c00003", reason="fix", tags={"desk": "x"}), stream="call-c00003"),
        finished("c00003", 3, 9),
    )
    one = await rebuild_projection(database, "calls", page_size=7)
    steps: list[str] = []
    seen: list[tuple[int, int]] = []
    three = await rebuild_projection(
        database, "calls", page_size=7, workers=3, stage=steps.append, progress=lambda a, b: seen.append((a, b))
    )
    assert three.digest == one.digest and three.version == one.version + 1
    assert steps[0] == f"folding events into version {three.version} in 3 worker processes"
    head = one.head_position + 1  # `one`'s promotion was appended since
    assert seen[:3] == [(head // 3, head), (2 * head // 3, head), (head, head)]
    async with database.engine.connect() as conn:
        stored = (await conn.execute(select(calls).where(calls.c.version == three.version))).all()
    assert len(stored) == 7 + 120
    by_id = {row.call_id: row for row in stored}
    assert by_id["c00003"].retags == 1 and by_id["c00003"].tags == '{"desk":"x"}'


async def test_workers_fold_in_one_process_when_an_event_is_outside_its_calls_stream(database: Database) -> None:
    """The workers split the events by stream (`call-<id>`); a call event appended to another stream would put
    one call in two workers, so the version is folded again in this process, to the same rows."""
    await append_plain_calls(database, 30, batch=10)
    await append(database, new_event(CallRetagged(call_id="c00004", reason="fix", tags={"desk": "y"}), stream="desk"))
    one = await rebuild_projection(database, "calls", page_size=7)
    steps: list[str] = []
    two = await rebuild_projection(database, "calls", page_size=7, workers=2, stage=steps.append)
    assert two.digest == one.digest
    assert steps[1] == f"an event outside its key's stream: folding events into version {two.version} in this process"
    async with database.engine.connect() as conn:
        stored = (await conn.execute(select(calls).where(calls.c.version == two.version))).all()
    assert len(stored) == 30 and {row.call_id: row for row in stored}["c00004"].tags == '{"desk":"y"}'


async def test_a_failing_worker_stops_the_others_at_their_next_page(database: Database) -> None:
    """A worker that fails at its first page (a forged `call.finished` it cannot decode, first in the ledger and
    in the upper range of streams) fails the rebuild with its error once every worker has ended: the other one
    stops at its next page. It does not go on folding the rest of its range (750 calls in pages of 1 position)
    into a version that will never be promoted, behind the rebuild's back, keeping its process from exiting.

    Pages of one position: the other worker's range is then ≈ 3,000 pages, seconds of work, where a worker's
    start-up on a loaded box may lag the other's by one (with pages of 4 it finished first 1 time in 13 there)."""
    now = at(0)
    async with database.engine.begin() as conn:
        await conn.execute(
            events.insert().values(
                position=1,
                event_id=uuid.uuid4(),
                type="call.finished",
                stream="call-zz",
                occurred_at=now,
                recorded_at=now,
                payload='{"type":"call.finished","call_id":"zz"}',
                hash="0" * 64,
            )
        )
        await conn.execute(update(head).values(position=1, hash="0" * 64))
    await append_plain_calls(database, 1500)  # streams call-c00000 … call-c01499: c00750 on are the upper range
    before = set(multiprocessing.active_children())
    with pytest.raises(msgspec.ValidationError):
        await rebuild_projection(database, "calls", page_size=1, workers=2)
    assert not set(multiprocessing.active_children()) - before  # no worker outlives the rebuild
    async with database.engine.connect() as conn:
        left = (
            await conn.execute(select(func.max(checkpoints.c.version)).where(checkpoints.c.projection == "calls"))
        ).scalar_one()
        written = (await conn.execute(select(func.count()).where(calls.c.version == left))).scalar_one()
    assert written < 750  # the lower worker stopped short of its range's end


async def test_workers_must_be_one_or_more(database: Database) -> None:
    with pytest.raises(ValueError, match="workers must be 1 or more, not 0"):
        await rebuild_projection(database, "calls", workers=0)
    empty = await rebuild_projection(database, "calls", workers=2)  # nothing to fold: the workers read nothing
    assert empty.head_position == 0
