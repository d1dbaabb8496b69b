"""SQLite appends on a dedicated thread, one round trip per batch.

Through aiosqlite every statement is a hop to its thread and back through the event loop; a busy
gateway loop then stretched one append into many loop turns. Here the whole transaction — blobs,
tail, inserts, commit — runs in one call on the appender's own thread with the
standard `sqlite3` module (which releases the GIL while SQLite works). Other writers that share
the ledger's write lock run their transactions the same way (`transaction`).

Checkpoints (copying the WAL back into the database file) run on a second thread with its own
connection, `PASSIVE` so they never block an append: inline, SQLite's automatic checkpoint ran
inside the COMMIT that crossed its threshold (≈ 1,000 pages) and stalled that batch and every
producer waiting on it. The appender still checkpoints inline if the background falls
`_BACKSTOP_PAGES` behind. Durability is unchanged: every COMMIT syncs the WAL as before.

The write lock is polled for every `_LOCK_POLL_S` rather than left to SQLite's busy handler,
which sleeps 1, 2, 5, 10, 15 ms... between tries: behind another writer (the projection follower)
holding the lock for 2 ms, an append waited 3 or 8 ms, and strict-mode responses with it.

A stream (`stream`: `ledger import`'s file) is one write transaction over many batches, each chained
by the same `_insert`; the thread is lent to it (`_thread.Loan`) from BEGIN to COMMIT or ROLLBACK, so
no other append of this process lands inside it, and other processes wait for the write lock as long.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import NoReturn, TypeVar, cast

from usage_ledger.ledger._rows import EVENT_COLUMNS, build_rows
from usage_ledger.ledger._thread import Loan, ThreadConnection
from usage_ledger.ledger.blobs import PreparedBlob
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError
from usage_ledger.ledger.events import NewEvent
from usage_ledger.ledger.schema import sqlite_time

__all__ = ("SqliteAppender", "SqliteStream")

T = TypeVar("T")

_INSERT_EVENTS = (
    f"INSERT INTO ledger_events ({', '.join(EVENT_COLUMNS)}) VALUES ({', '.join('?' * len(EVENT_COLUMNS))})"
)
_INSERT_BLOBS = (
    "INSERT INTO ledger_blobs (hash, size, codec, stored_size, content, created_at) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (hash) DO NOTHING"
)
_READ_HEAD = "SELECT position, hash FROM ledger_head WHERE id = 1"
_MOVE_HEAD = "UPDATE ledger_head SET position = ?, hash = ? WHERE id = 1"
# What a batch writes to the WAL, roughly: its payloads and bodies, plus index pages per event and
# per commit; a background checkpoint is asked for every `_CHECKPOINT_BYTES` of that.
_CHECKPOINT_BYTES = 4 << 20  # about SQLite's own threshold (1,000 pages of 4 KiB)
_ROW_OVERHEAD = 1024
_COMMIT_OVERHEAD = 16 << 10
_BACKSTOP_PAGES = 10_000
_PAGE_BYTES = 4096  # SQLite's default page size, which the ledger keeps
_WAL_RESTART_BYTES = 8 << 20  # a WAL longer than this is emptied (`_Checkpointer._restart_wal`)
_WAL_KEPT_BYTES = 64 << 20
"""`journal_size_limit`: whenever SQLite starts the WAL over, it cuts the file back to this, so space a long
read held on to (a full disk's WAL ate what was freed) is given back even when no TRUNCATE got through."""
_WAL_RESTART_WAIT_MS = 100
_CACHE_KIB = -65536  # negative: KiB, as SQLite's PRAGMA cache_size takes it
_STREAM_CACHE_KIB = -16384
"""A stream's cache: its dirty pages are held until COMMIT, so a full 64 MiB cache was 43 MiB more peak RSS
for a file of 150,000 rows (`bench/import_memory.py`), and no faster."""
_LOCK_POLL_S = 0.0002
_LOCK_TIMEOUT_S = 30.0


class _Checkpointer(ThreadConnection):
    """Runs `PRAGMA wal_checkpoint(PASSIVE)` on its own thread; requests coalesce."""

    def __init__(self, path: str, synchronous: str) -> None:
        super().__init__(path, synchronous, "ledger-sqlite-checkpoint")
        self._lock = threading.Lock()
        self._queued = False
        self.completed = 0  # checkpoints run (for tests and diagnostics)

    def request(self) -> None:
        with self._lock:
            if self._queued:
                return
            self._queued = True
        self._submit(self._checkpoint)

    def _checkpoint(self) -> None:
        with self._lock:
            self._queued = False
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
                self._conn.execute(f"PRAGMA synchronous={self.synchronous}")
            _, wal_pages, _ = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if wal_pages * _PAGE_BYTES > _WAL_RESTART_BYTES:
                self._restart_wal(self._conn)
            self.completed += 1
        except sqlite3.Error:
            self._reset()  # the appender's backstop checkpoints inline meanwhile; reconnect on the next request

    @staticmethod
    def _restart_wal(conn: sqlite3.Connection) -> None:
        """Empty the WAL file; gives up after `_WAL_RESTART_WAIT_MS` if writers or readers are in the way.

        PASSIVE checkpoints copy the WAL's frames but never restart it: SQLite writes from the start
        of the file again only when a transaction begins with every frame copied and no reader on
        them, a moment that never came under steady appends and reads, and the file grew (26 MiB
        beside a 7 MiB database in the full-disk test, which it filled again). TRUNCATE holds the
        write lock while it waits, so the wait is kept short: a reader holding one snapshot longer
        (a whole-ledger scan) makes it give up, and the WAL is bounded only once such reads end.
        """
        conn.execute(f"PRAGMA busy_timeout={_WAL_RESTART_WAIT_MS}")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()  # busy: try again next time
        finally:
            conn.execute("PRAGMA busy_timeout=30000")


class SqliteAppender(ThreadConnection):
    """Owns one `sqlite3` connection on one thread; `append` runs a whole batch there."""

    def __init__(self, path: str, synchronous: str = "FULL") -> None:
        super().__init__(path, synchronous, "ledger-sqlite-append")
        self._checkpointer = _Checkpointer(path, synchronous) if path not in ("", ":memory:") else None
        self._unchecked_bytes = 0  # estimated WAL bytes written since the last checkpoint request

    async def append(
        self, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob], recorded_at: datetime
    ) -> tuple[int, int, int]:
        """(appended, duplicates, last position); raises DatabaseUnavailable / LedgerError."""
        return await self._call(self._append, batch, blobs, recorded_at)

    async def transaction(self, work: Callable[[sqlite3.Connection], T], *, durable: bool = True) -> T:
        """Run `work(conn)` in one write transaction on the appender's thread: one round trip.

        For other writers that share the ledger's write lock (the projection follower): through
        aiosqlite their few statements held the lock 3-6 ms, which strict-mode appends waited out.
        Errors as in `append`; an exception from `work` rolls back and propagates as it is.

        `durable=False`: the COMMIT does not wait for the disk (`synchronous=NORMAL`), so the lock is
        not held through an fsync, for data that can be derived again (read models and their
        checkpoints). Still atomic; a power loss may undo the latest such commits, never a later
        durable one (the WAL is synced in order).
        """
        return await self._call(self._transaction, work, "write", durable)

    async def stream(self) -> SqliteStream:
        """A write transaction for many batches, begun (the write lock held) before this returns."""
        loan = self.lend(self._stream_end)
        try:
            await loan.call(self._stream_begin)
        except BaseException:
            loan.end()
            raise
        return SqliteStream(self, loan)

    def close(self) -> None:
        super().close()
        if self._checkpointer is not None:
            self._checkpointer.close()

    # -- on the appender thread ---------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            # no busy handler: `_begin` polls for the write lock, the one lock an append waits for
            # (in WAL mode, once it is held, nothing else in the transaction waits on other connections)
            conn.execute("PRAGMA busy_timeout=0")
            # up to 64 MiB of pages (default 2 MiB): the id and stream indexes take random inserts,
            # and with the default cache each batch re-read their pages that the appended rows evicted
            conn.execute(f"PRAGMA cache_size={_CACHE_KIB}")
            if self._checkpointer is not None:
                conn.execute(f"PRAGMA wal_autocheckpoint={_BACKSTOP_PAGES}")
                conn.execute(f"PRAGMA journal_size_limit={_WAL_KEPT_BYTES}")
            self._conn = conn
        return self._conn

    def _append(
        self, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob], recorded_at: datetime
    ) -> tuple[int, int, int]:
        rows, last = self._transaction(lambda conn: self._insert(conn, batch, blobs, recorded_at), "append")
        self._written(rows, blobs)
        return len(rows), len(batch) - len(rows), last

    def _written(self, rows: list[tuple[object, ...]], blobs: Sequence[PreparedBlob]) -> None:
        """Count what went to the WAL; ask for a background checkpoint every `_CHECKPOINT_BYTES`."""
        if self._checkpointer is not None:
            self._unchecked_bytes += (
                _COMMIT_OVERHEAD
                + sum(len(cast(str, row[6])) for row in rows)
                + _ROW_OVERHEAD * len(rows)
                + sum(len(blob.content) for blob in blobs)
            )
            if self._unchecked_bytes >= _CHECKPOINT_BYTES:
                self._unchecked_bytes = 0
                self._checkpointer.request()

    def _stream_begin(self) -> None:
        # a stream's pages stay dirty until its COMMIT: beyond this many they spill to the WAL
        self._begin_write(f"PRAGMA cache_size={_STREAM_CACHE_KIB}")

    def _stream_insert(self, batch: Sequence[NewEvent], recorded_at: datetime) -> tuple[int, int, int]:
        conn = self._stream_conn()
        try:
            rows, last = self._insert(conn, batch, (), recorded_at)
        except BaseException as exc:
            self._undo(conn, exc, "append")  # the whole stream: none of its batches stays
        self._written(rows, ())
        return len(rows), len(batch) - len(rows), last

    def _stream_commit(self) -> None:
        conn = self._stream_conn()
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            self._undo(conn, exc, "append")

    def _stream_end(self) -> None:
        """Last on a loan: a stream neither committed nor undone yet (its caller failed or gave up) rolls back."""
        if self._conn is None:
            return
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._conn.execute(f"PRAGMA cache_size={_CACHE_KIB}")
        except sqlite3.Error:
            self._reset()  # closing the connection rolls back too; the next use reconnects with the ledger's cache

    def _stream_conn(self) -> sqlite3.Connection:
        if self._conn is None or not self._conn.in_transaction:
            raise LedgerError(f"append to SQLite ledger {self.path} failed: the stream's transaction has ended")
        return self._conn

    def _insert(
        self, conn: sqlite3.Connection, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob], recorded_at: datetime
    ) -> tuple[list[tuple[object, ...]], int]:
        """The batch's blobs and events, chained onto the tail (inside the write transaction)."""
        if blobs:
            created = sqlite_time(recorded_at)
            conn.executemany(
                _INSERT_BLOBS, [(b.hash, b.size, b.codec, len(b.content), b.content, created) for b in blobs]
            )
        tail = conn.execute(_READ_HEAD).fetchone()
        if tail is None:
            raise LedgerError(f"SQLite ledger {self.path} has no head row (ledger_head): run `ledger db upgrade`")
        position, previous = int(tail[0]), bytes.fromhex(tail[1])
        # Optimistic: insert as if no event id were stored yet (the unique index checks each one
        # anyway); only when one is — a spool replay, a re-import — look them up and redo.
        rows, last = build_rows(batch, set(), position, previous, recorded_at, as_text=True)
        if rows:
            conn.execute("SAVEPOINT ledger_events_insert")
            try:
                conn.executemany(_INSERT_EVENTS, rows)
            except sqlite3.IntegrityError:
                conn.execute("ROLLBACK TO ledger_events_insert")
                existing = self._existing(conn, [e.event_id for e in batch])
                rows, last = build_rows(batch, existing, position, previous, recorded_at, as_text=True)
                if rows:
                    conn.executemany(_INSERT_EVENTS, rows)
            conn.execute("RELEASE ledger_events_insert")
            if rows:
                conn.execute(_MOVE_HEAD, (last, rows[-1][7]))
        return rows, last

    def _transaction(self, work: Callable[[sqlite3.Connection], T], what: str = "write", durable: bool = True) -> T:
        """BEGIN IMMEDIATE (polled), `work`, COMMIT; ROLLBACK and the ledger's errors on failure."""
        # synchronous is set outside the transaction: it cannot change inside one
        conn = self._begin_write(None if durable else "PRAGMA synchronous=NORMAL")
        try:
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException as exc:
            self._undo(conn, exc, what)
        finally:
            if not durable and self._conn is not None:
                try:
                    self._conn.execute(f"PRAGMA synchronous={self.synchronous}")
                except sqlite3.Error:
                    self._reset()  # the next use reconnects with the ledger's setting
        return result

    def _begin_write(self, pragma: str | None) -> sqlite3.Connection:
        """`pragma` (if any), then BEGIN IMMEDIATE (polled); a failure drops the connection: DatabaseUnavailable."""
        try:
            conn = self._connection()
            if pragma is not None:
                conn.execute(pragma)
            _begin(conn)
        except sqlite3.Error as exc:
            self._reset()
            raise DatabaseUnavailable(f"SQLite ledger {self.path} unavailable: {exc}") from exc
        return conn

    def _undo(self, conn: sqlite3.Connection, exc: BaseException, what: str) -> NoReturn:
        """ROLLBACK after `exc`, then raise it: SQLite's errors as the ledger's, anything else as it is."""
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            self._reset()
        if isinstance(exc, sqlite3.OperationalError):
            raise DatabaseUnavailable(f"SQLite ledger {self.path} unavailable: {exc}") from exc
        if isinstance(exc, sqlite3.Error):
            raise LedgerError(f"{what} to SQLite ledger {self.path} failed: {exc}") from exc
        raise exc

    def _existing(self, conn: sqlite3.Connection, ids: list[uuid.UUID]) -> set[uuid.UUID]:
        found: set[uuid.UUID] = set()
        for start in range(0, len(ids), 500):
            chunk = [i.hex for i in ids[start : start + 500]]
            marks = ", ".join("?" * len(chunk))
            cursor = conn.execute(f"SELECT event_id FROM ledger_events WHERE event_id IN ({marks})", chunk)
            found.update(uuid.UUID(row[0]) for row in cursor)
        return found


def _begin(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, trying again every `_LOCK_POLL_S` while another connection writes."""
    deadline = time.monotonic() + _LOCK_TIMEOUT_S
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(_LOCK_POLL_S)


class SqliteStream:
    """One write transaction on SQLite for many batches (`SqliteAppender.stream`); `close` ends it either way."""

    def __init__(self, appender: SqliteAppender, loan: Loan) -> None:
        self._appender = appender
        self._loan = loan

    async def add(self, batch: Sequence[NewEvent], recorded_at: datetime) -> tuple[int, int, int]:
        """(appended, duplicates, last position) of one batch, chained after the stream's earlier ones."""
        return await self._loan.call(self._appender._stream_insert, batch, recorded_at)

    async def commit(self) -> None:
        await self._loan.call(self._appender._stream_commit)

    def close(self) -> None:
        """Give the thread back; a transaction not committed by then is rolled back first."""
        self._loan.end()
