"""SQLite specifics of the appender: WAL checkpoints on their own thread, never inside an append."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import usage_ledger.ledger.sqlite_append as sqlite_append
from tests._polling import wait_until
from tests.ledger.helpers import call_events
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.errors import DatabaseUnavailable
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.sqlite_append import SqliteAppender
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.ledger.writer import EventWriter


async def test_background_checkpoints_copy_the_wal_while_appends_and_reads_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_append, "_CHECKPOINT_BYTES", 1)  # ask after every commit
    path = tmp_path / "l.db"
    database = open_database(f"sqlite:///{path}")
    await upgrade_database(database)
    size_before = path.stat().st_size
    appender = database.appender
    assert isinstance(appender, SqliteAppender) and appender._checkpointer is not None

    async def reader() -> None:
        for _ in range(20):
            [e async for e in iter_events(database)]
            await asyncio.sleep(0)

    try:
        async with EventWriter(database, batch_max_events=50) as writer:
            producers = [writer.append(call_events(i)) for i in range(300)]
            outcomes, _ = await asyncio.gather(asyncio.gather(*producers), reader())
        assert set(outcomes) == {"committed"}
        report = await verify_chain(database)
        assert report.ok and report.checked == 600
        checkpointer = appender._checkpointer
        await checkpointer._call(lambda: None)  # the last request has run
        assert checkpointer.completed >= 1
        # In WAL mode only a checkpoint writes the database file, so its growth is what the checkpoints
        # copied, measured while every connection is still open (closing the last one checkpoints
        # everything anyway). The 600 events take ≈ 450 KB; the file held the schema alone before.
        # Reading it with a second, `immutable` connection instead failed once in CI with "database
        # disk image is malformed", as if a checkpoint was writing meanwhile; the size cannot tear.
        assert path.stat().st_size - size_before > 200_000
    finally:
        await database.dispose()


def _size(path: Path) -> int:
    return path.stat().st_size


@dataclass
class _LongWal:
    database: Database
    wal: Path
    reader: sqlite3.Connection
    """In a transaction since before the appends: no checkpoint gets past its snapshot until it commits."""
    checkpoints_done: Callable[[], Awaitable[None]]
    """Until the checkpoint thread has run what was asked of it."""


@contextlib.asynccontextmanager
async def _long_wal(tmp_path: Path) -> AsyncIterator[_LongWal]:
    """A SQLite ledger whose WAL grew past a reader: 400 calls appended, in batches of 50, while it held its snapshot."""
    path = tmp_path / "l.db"
    database = open_database(f"sqlite:///{path}")
    await upgrade_database(database)
    appender = database.appender
    assert isinstance(appender, SqliteAppender) and appender._checkpointer is not None
    checkpointer = appender._checkpointer

    async def checkpoints_done() -> None:
        await checkpointer._call(lambda: None)

    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM ledger_events").fetchone()
        for start in range(0, 400, 50):
            await append_events(database, [e for i in range(start, start + 50) for e in call_events(i)])
        await checkpoints_done()
        yield _LongWal(database, Path(f"{path}-wal"), reader, checkpoints_done)
    finally:
        reader.close()
        await database.dispose()


async def test_a_long_wal_is_emptied_once_readers_let_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PASSIVE checkpoints alone left the WAL file at its longest: 26 MiB beside a 7 MiB database filled
    the full-disk test's 32 MiB disk again once the spool replayed into it."""
    monkeypatch.setattr(sqlite_append, "_CHECKPOINT_BYTES", 1)  # a checkpoint after every commit
    monkeypatch.setattr(sqlite_append, "_WAL_RESTART_BYTES", 64 << 10)
    async with _long_wal(tmp_path) as long:
        assert _size(long.wal) > 256 << 10
        long.reader.execute("COMMIT")
        await append_events(long.database, call_events(400))  # asks for a checkpoint with nothing in the way
        await long.checkpoints_done()
        assert _size(long.wal) < 64 << 10
        assert (await verify_chain(long.database)).checked == 802


async def test_the_wal_is_cut_back_whenever_it_starts_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team, round three: on a full disk the WAL kept the space a long read had made it take. With
    TRUNCATE kept out of reach, `journal_size_limit` alone gives it back when the WAL starts over."""
    monkeypatch.setattr(sqlite_append, "_CHECKPOINT_BYTES", 1)
    monkeypatch.setattr(sqlite_append, "_WAL_RESTART_BYTES", 1 << 40)  # never TRUNCATE
    monkeypatch.setattr(sqlite_append, "_WAL_KEPT_BYTES", 128 << 10)
    async with _long_wal(tmp_path) as long:
        assert _size(long.wal) > 512 << 10
        long.reader.execute("COMMIT")
        await append_events(long.database, call_events(400))  # checkpointed whole, with no reader in the way
        await long.checkpoints_done()
        await append_events(long.database, call_events(401))  # starts the WAL over: cut back to the limit
        assert _size(long.wal) <= 128 << 10


async def test_the_appender_checkpoints_inline_only_far_behind_and_caches_more_pages(tmp_path: Path) -> None:
    database = open_database(f"sqlite:///{tmp_path / 'l.db'}")
    await upgrade_database(database)
    try:
        await append_events(database, call_events(1))
        appender = database.appender
        assert isinstance(appender, SqliteAppender)

        def pragmas() -> tuple[int, int]:
            conn = appender._connection()
            return (
                conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0],
                conn.execute("PRAGMA cache_size").fetchone()[0],
            )

        assert await appender._call(pragmas) == (
            sqlite_append._BACKSTOP_PAGES,
            sqlite_append._CACHE_KIB,
        )
    finally:
        await database.dispose()


async def test_an_append_waits_for_another_writer_and_gives_up_after_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "l.db"
    database = open_database(f"sqlite:///{path}")
    await upgrade_database(database)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # e.g. the projection follower's transaction
        append = asyncio.create_task(append_events(database, call_events(1)))
        await asyncio.sleep(0.3)
        assert not append.done()  # waiting for the lock, not failed with "database is locked"
        other.execute("COMMIT")
        assert (await append).appended == 2

        monkeypatch.setattr(sqlite_append, "_LOCK_TIMEOUT_S", 0.2)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(DatabaseUnavailable, match="locked"):
            await append_events(database, call_events(2))
        other.execute("ROLLBACK")
        assert (await append_events(database, call_events(2))).appended == 2
    finally:
        other.close()
        await database.dispose()


async def test_a_transaction_runs_on_the_appender_and_only_a_non_durable_one_skips_the_sync(tmp_path: Path) -> None:
    """`transaction(durable=False)` commits with synchronous=NORMAL and puts FULL back afterwards,
    also when its work fails (which rolls it back); appends stay synced."""
    database = open_database(f"sqlite:///{tmp_path / 'ledger.db'}")
    await upgrade_database(database)
    appender = database.appender
    assert isinstance(appender, SqliteAppender)
    synchronous = "PRAGMA synchronous"  # 1 = NORMAL, 2 = FULL

    def failing(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE scratch (x)")
        raise RuntimeError("work failed")

    try:
        assert await appender.transaction(lambda c: c.execute(synchronous).fetchone()[0], durable=False) == 1
        assert await appender.transaction(lambda c: c.execute(synchronous).fetchone()[0]) == 2
        with pytest.raises(RuntimeError, match="work failed"):
            await appender.transaction(failing, durable=False)
        assert await appender.transaction(lambda c: c.execute(synchronous).fetchone()[0]) == 2
        tables = await appender.transaction(lambda c: c.execute("SELECT name FROM sqlite_master").fetchall())
        assert ("scratch",) not in tables
        await append_events(database, call_events(1))
        assert await appender.transaction(lambda c: c.execute(synchronous).fetchone()[0]) == 2
    finally:
        await database.dispose()


async def test_the_appender_thread_outlives_a_cancelled_caller_and_refuses_work_once_closed(tmp_path: Path) -> None:
    """The hand-off to the appender's thread: a caller that gives up does not lose the work already
    started nor stop the thread; results and errors reach the right caller; closing is final."""
    database = open_database(f"sqlite:///{tmp_path / 'ledger.db'}")
    await upgrade_database(database)
    appender = database.appender
    assert isinstance(appender, SqliteAppender)
    release, started = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> int:
        started.set()
        release.wait(5)
        conn.execute("CREATE TABLE finished_anyway (x)")
        return 1

    try:
        waiting = asyncio.ensure_future(appender.transaction(slow))
        await wait_until(started.is_set, what="the work started on the thread")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        names = await appender.transaction(lambda c: [r[0] for r in c.execute("SELECT name FROM sqlite_master")])
        assert "finished_anyway" in names  # queued behind the cancelled work, which ran to its commit
        with pytest.raises(ZeroDivisionError):
            await appender.transaction(lambda c: 1 // 0)
        assert (await append_events(database, call_events(1))).appended == 2
    finally:
        await database.dispose()
    appender.close()  # a second close is harmless
    with pytest.raises(RuntimeError, match="closed"):
        await appender.transaction(lambda c: None)
