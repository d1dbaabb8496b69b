"""Rebuilds: what the bulk (SQL) load takes and leaves to the fold, promotion, status, formulas, progress."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from tests.projections.helpers import append, append_plain_calls, at, failed, finished, started
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import (
    CallImported,
    CallRetagged,
    ProjectionPromoted,
    new_event,
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
