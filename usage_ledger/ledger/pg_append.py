"""PostgreSQL appends on a dedicated thread with its own event loop and connection.

The design (the `ledger_head` row lock, bodies committed before it, one message with the COMMIT under it, the WAL
flush out of it, the bounds on a stopped holder) is docs/scaling.md §1; the why of each step is there.

A stream (`stream`: `ledger import`'s file) is one transaction over many batches, each chained by
the same `_insert_events` in a savepoint (its optimistic insert may be redone). It holds the head
from its first batch to its COMMIT: every other appender waits that long. The appender's loop
serves the stream alone meanwhile (a job of this process run in between would land inside it).
Streams take no bodies (import has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
import msgspec

from usage_ledger.ledger._rows import build_rows
from usage_ledger.ledger._thread import settle  # the appenders' one way of handing back an outcome
from usage_ledger.ledger.blobs import PreparedBlob
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError, first_line
from usage_ledger.ledger.events import NewEvent

__all__ = ("PostgresAppender", "PostgresStream")

T = TypeVar("T")
_Step = tuple[Callable[..., Awaitable[Any]], tuple[Any, ...], "asyncio.AbstractEventLoop | None", Any]
"""A coroutine function to run on the appender's loop, its arguments, and the caller's loop and future (or None)."""

_json = msgspec.json.Encoder()
_WRITTEN_OUT_MAX = 64
"""Events up to which an append's rows go in one message with its COMMIT (`_written_out`; docs/scaling.md §1)."""
_BEGIN = (
    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit TO off; "
    "SET LOCAL lock_timeout = {lock_ms}; SET LOCAL idle_in_transaction_session_timeout = {idle_ms}"
)
"""An append's transactions (its bodies', its events'), with the bounds of `PostgresAppender` (0: none)."""
_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired
_COMMIT = "COMMIT; BEGIN; SELECT pg_logical_emit_message(true, 'usage-ledger', 'flush'); COMMIT"
"""An append's COMMIT (not waiting for the WAL flush), then a transaction whose COMMIT waits for it (a
transactional message gives it an id and a WAL record: a COMMIT without both does not wait; docs/scaling.md §1)."""
_READ_HEAD = "SELECT position, hash FROM ledger_head WHERE id = 1 FOR UPDATE"
_STORED_IDS = "SELECT event_id FROM ledger_events WHERE event_id = ANY($1::uuid[])"
_INSERT_EVENTS = """
WITH moved AS (UPDATE ledger_head SET position = $9, hash = $10 WHERE id = 1)
INSERT INTO ledger_events (position, event_id, type, stream, occurred_at, recorded_at, payload, hash)
SELECT p, i, t, s, o, $6, pl, h
FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[], $7::text[], $8::text[])
    AS r(p, i, t, s, o, pl, h)
"""
_INSERT_BLOBS = """
INSERT INTO ledger_blobs (hash, size, codec, stored_size, content, created_at)
SELECT h, sz, c, st, ct, $6 FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bytea[])
    AS b(h, sz, c, st, ct)
ON CONFLICT (hash) DO NOTHING
"""
_STALE_HEAD = (
    "append to {url} refused: a position after ledger_head is already stored, so the head is behind the events "
    "(a gateway of a version before migration 0005 appended after `ledger db upgrade`?); stop it, then set the "
    "head to the stored tail (docs/operations.md, Several gateways)"
)
# SQLSTATE classes meaning "the database cannot take this now" (the writer spools and retries):
# connection exception, insufficient resources (a full disk), operator intervention (shutdown).
_UNAVAILABLE_CLASSES = ("08", "53", "57")
# Failures that mean the connection is gone. InternalClientError: the server's goodbye (FATAL 57P01 on a restart or
# failover) arrived while the connection was idle, and asyncpg's protocol is wrecked until the EOF behind it is read
# ("cannot switch to state 15; another operation (2) is in progress"): as lost as after the EOF; only reconnecting helps.
_CONNECTION_LOST = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.InternalClientError,
)


class PostgresAppender:
    """One asyncpg connection, used only on this object's thread and event loop."""

    def __init__(
        self,
        connect_kwargs: Mapping[str, Any],
        safe_url: str,
        *,
        lock_timeout_s: float = 2.0,
        idle_in_transaction_timeout_s: float = 5.0,
    ) -> None:
        """The timeouts are `LEDGER_PG_LOCK_TIMEOUT_S` and `LEDGER_PG_IDLE_IN_TRANSACTION_TIMEOUT_S`
        (docs/configuration.md); 0: no bound (PostgreSQL's meaning)."""
        self._connect_kwargs = dict(connect_kwargs)
        self._safe_url = safe_url
        self._lock_timeout_s = lock_timeout_s
        self._begin = _BEGIN.format(
            lock_ms=_milliseconds(lock_timeout_s), idle_ms=_milliseconds(idle_in_transaction_timeout_s)
        )
        self._conn: Any = None  # asyncpg.Connection, opened on first use
        self._stream: Any = None  # the open stream's asyncpg.Transaction, while one is
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue[_Step | None] | None = None
        self._ready = threading.Event()
        self._closed = False
        # a daemon: a database never disposed must not keep the interpreter from exiting
        self._thread = threading.Thread(target=self._serve, name="ledger-pg-append", daemon=True)
        self._thread.start()
        self._ready.wait()

    async def append(
        self, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob], recorded_at: datetime
    ) -> tuple[int, int, int]:
        """(appended, duplicates, last position); raises DatabaseUnavailable / LedgerError.

        Cancelling the caller does not stop the work: an append the caller gave up on may still
        commit, as one already sent always could."""
        if self._closed:
            raise RuntimeError("the PostgreSQL appender is closed")
        assert self._queue is not None
        return await self._ask(self._queue, self._append, batch, blobs, recorded_at)

    async def stream(self) -> PostgresStream:
        """A transaction for many batches, begun before this returns (the head is locked by its first batch)."""
        if self._closed:
            raise RuntimeError("the PostgreSQL appender is closed")
        assert self._queue is not None
        steps: asyncio.Queue[_Step | None] = asyncio.Queue()  # used on the appender's loop only
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (self._lend, (steps,), None, None))
        stream = PostgresStream(self, steps)
        try:
            await stream.call(self._stream_begin)
        except BaseException:
            stream.close()
            raise
        return stream

    async def _ask(self, queue: asyncio.Queue[_Step | None], fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await fn(*args)` on the appender's loop, taken from `queue` in turn; the outcome comes back here."""
        caller = asyncio.get_running_loop()
        done: asyncio.Future[T] = caller.create_future()
        self._loop.call_soon_threadsafe(queue.put_nowait, (fn, args, caller, done))
        return await done

    def close(self) -> None:
        """Finish the appends queued, close the connection, end the thread."""
        if self._closed:
            return
        self._closed = True
        assert self._queue is not None
        self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
        self._thread.join()

    # -- on the appender thread ---------------------------------------------------------------
    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._work())
        finally:
            self._loop.close()

    async def _work(self) -> None:
        self._queue = asyncio.Queue()
        self._ready.set()
        await _run_all(self._queue)
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close(timeout=5)
            except Exception:  # the server is gone or slow: drop the socket
                conn.terminate()

    async def _lend(self, steps: asyncio.Queue[_Step | None]) -> None:
        """A stream's steps, and nothing else, until it closes; then roll back what it did not commit."""
        await _run_all(steps)
        if self._stream is not None:
            transaction, self._stream = self._stream, None
            try:
                await transaction.rollback()
            except Exception:
                await self._reset()  # a dropped connection rolls back too

    async def _append(
        self, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob], recorded_at: datetime
    ) -> tuple[int, int, int]:
        async def work() -> tuple[int, int, int]:
            conn = await self._connection()
            if blobs:
                await self._write_blobs(conn, blobs, recorded_at)
            return await self._optimistic(
                lambda check_existing: self._committed(conn, batch, recorded_at, check_existing)
            )

        return await self._guarded(work())

    async def _stream_begin(self) -> None:
        async def work() -> None:
            conn = await self._connection()
            transaction = conn.transaction(isolation="read_committed")  # as in `_committed`
            await transaction.start()
            self._stream = transaction

        await self._guarded(work())

    async def _stream_add(self, batch: Sequence[NewEvent], recorded_at: datetime) -> tuple[int, int, int]:
        """The batch chained onto the head in a savepoint of the stream's transaction."""
        self._open_stream()
        conn = self._conn

        async def attempt(check_existing: bool) -> tuple[int, int, int]:
            async with conn.transaction():
                return await self._insert_events(conn, batch, recorded_at, check_existing=check_existing)

        return await self._guarded(self._optimistic(attempt))

    async def _stream_commit(self) -> None:
        transaction, self._stream = self._open_stream(), None
        await self._guarded(transaction.commit())

    def _open_stream(self) -> Any:
        if self._stream is None:
            raise LedgerError(f"append to {self._safe_url} failed: the stream's transaction has ended")
        return self._stream

    async def _optimistic(self, attempt: Callable[[bool], Awaitable[T]]) -> T:
        """`attempt(False)`: insert as if no event id were stored yet (the unique index checks each one anyway).
        One was — a spool replay, a re-import: `attempt(True)`, dropping stored ids. A position already stored
        means the head is behind the events."""
        try:
            return await attempt(False)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == "pk_ledger_events":
                raise LedgerError(_STALE_HEAD.format(url=self._safe_url)) from exc
            return await attempt(True)

    async def _committed(
        self, conn: Any, batch: Sequence[NewEvent], recorded_at: datetime, check_existing: bool
    ) -> tuple[int, int, int]:
        """The batch chained onto the head in a transaction of its own, whose COMMIT goes with the INSERT."""
        # READ COMMITTED whatever the server's default: a `FOR UPDATE` that waited then reads the head the
        # holder's commit left (under REPEATABLE READ or SERIALIZABLE it would fail instead). Its COMMIT does
        # not wait for the WAL flush: `_COMMIT`'s second transaction does, with the head released.
        await conn.execute(self._begin)
        try:
            return await self._insert_events(conn, batch, recorded_at, check_existing=check_existing, commit=True)
        except BaseException:
            with contextlib.suppress(Exception):  # a broken connection is dropped by the caller
                await conn.execute("ROLLBACK")
            raise

    async def _guarded(self, work: Awaitable[T]) -> T:
        """`work`, with a failure other than the ledger's own dropping the connection and said as the ledger's."""
        try:
            return await work
        except LedgerError:
            raise
        except Exception as exc:
            await self._reset()  # whatever state the failure left the connection in: the next append starts afresh
            text = first_line(exc)
            if getattr(exc, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                raise DatabaseUnavailable(
                    f"append to {self._safe_url} gave up: the ledger's head stayed locked by another appender for "
                    f"{self._lock_timeout_s:g} s (LEDGER_PG_LOCK_TIMEOUT_S; a stopped holder's transaction is ended "
                    "after LEDGER_PG_IDLE_IN_TRANSACTION_TIMEOUT_S)"
                ) from exc
            if _is_unavailable(exc):
                raise DatabaseUnavailable(f"database {self._safe_url} unavailable: {text}") from exc
            raise LedgerError(f"append to {self._safe_url} failed: {text}") from exc

    async def _connection(self) -> Any:
        if self._conn is None:
            self._conn = await asyncpg.connect(**self._connect_kwargs)
        return self._conn

    async def _reset(self) -> None:
        self._stream = None  # its transaction goes with the connection
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()  # no goodbye to a server that may be gone

    async def _write_blobs(self, conn: Any, blobs: Sequence[PreparedBlob], recorded_at: datetime) -> None:
        unique = list({blob.hash: blob for blob in blobs}.values())
        # a body row another appender inserted, uncommitted, is waited for as the head is
        await conn.execute(self._begin)
        try:
            await conn.execute(
                _INSERT_BLOBS,
                [b.hash for b in unique],
                [b.size for b in unique],
                [b.codec for b in unique],
                [len(b.content) for b in unique],
                [b.content for b in unique],
                recorded_at,
            )
        except BaseException:
            with contextlib.suppress(Exception):  # a broken connection is dropped by the caller
                await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")

    @staticmethod
    async def _insert_events(
        conn: Any, batch: Sequence[NewEvent], recorded_at: datetime, *, check_existing: bool, commit: bool = False
    ) -> tuple[int, int, int]:
        """Lock and read the head, insert the batch's new events after it and move it (inside a transaction)."""
        head = await conn.fetchrow(_READ_HEAD)  # the lock and the tail, one statement
        if head is None:
            raise LedgerError("the ledger has no head row (ledger_head): run `ledger db upgrade`")
        existing: set[uuid.UUID] = set()
        if check_existing:
            found = await conn.fetch(_STORED_IDS, [e.event_id for e in batch])
            existing = {uuid.UUID(str(row[0])) for row in found}
        rows, last = build_rows(
            batch, existing, int(head["position"]), bytes.fromhex(head["hash"]), recorded_at, as_text=False
        )
        if commit and len(rows) <= _WRITTEN_OUT_MAX:
            # one message: the server commits without waiting for this thread's next turn inside the lock
            await conn.execute(f"{_written_out(rows, recorded_at, last)}; {_COMMIT}" if rows else _COMMIT)
            return len(rows), len(batch) - len(rows), last
        if rows:
            position, event_id, type_, stream, occurred_at, _, payload, hashes = zip(*rows, strict=True)
            await conn.execute(
                _INSERT_EVENTS,
                position,
                event_id,
                type_,
                stream,
                occurred_at,
                recorded_at,
                payload,
                hashes,
                last,
                hashes[-1],
            )
        if commit:
            await conn.execute(_COMMIT)
        return len(rows), len(batch) - len(rows), last


class PostgresStream:
    """One PostgreSQL transaction for many batches (`PostgresAppender.stream`); `close` ends it either way."""

    def __init__(self, appender: PostgresAppender, steps: asyncio.Queue[_Step | None]) -> None:
        self._appender = appender
        self._steps = steps
        self._closed = False

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._closed:
            raise RuntimeError("the append stream is closed")
        return await self._appender._ask(self._steps, fn, *args)

    async def add(self, batch: Sequence[NewEvent], recorded_at: datetime) -> tuple[int, int, int]:
        """(appended, duplicates, last position) of one batch, chained after the stream's earlier ones."""
        return await self.call(self._appender._stream_add, batch, recorded_at)

    async def commit(self) -> None:
        await self.call(self._appender._stream_commit)

    def close(self) -> None:
        """Give the appender's loop back; a transaction not committed by then is rolled back first."""
        if not self._closed:
            self._closed = True
            self._appender._loop.call_soon_threadsafe(self._steps.put_nowait, None)


async def _run_all(queue: asyncio.Queue[_Step | None]) -> None:
    """Each step of `queue` in turn until None; a step's outcome goes to its caller's loop."""
    while (step := await queue.get()) is not None:
        fn, args, caller, done = step
        try:
            result, error = await fn(*args), None
        except BaseException as exc:  # handed to the caller
            result, error = None, exc
        if caller is not None:
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed: nobody waits any more
                caller.call_soon_threadsafe(settle, done, result, error)


def _written_out(rows: Sequence[tuple[Any, ...]], recorded_at: datetime, last: int) -> str:
    """`_INSERT_EVENTS` of `rows` with the values written out, for a simple query that carries the COMMIT too
    (parameters need the extended protocol: one statement a message). The rows go in as one JSON document in a dollar-quoted literal, with a tag it does not
    contain (no server setting changes what such a literal means), read back exactly by `->>`."""
    document = _json.encode([(p, i, t, s, o, pl, h) for p, i, t, s, o, _, pl, h in rows]).decode()
    tag = "q" + secrets.token_hex(8)  # a tag is an identifier: a letter first
    while f"${tag}$" in document:
        tag = "q" + secrets.token_hex(8)
    return (
        f"WITH moved AS (UPDATE ledger_head SET position = {int(last)}, hash = '{rows[-1][7]}' WHERE id = 1) "
        "INSERT INTO ledger_events (position, event_id, type, stream, occurred_at, recorded_at, payload, hash) "
        "SELECT (r->>0)::bigint, (r->>1)::uuid, r->>2, r->>3, (r->>4)::timestamptz, "
        f"'{recorded_at.isoformat()}'::timestamptz, r->>5, r->>6 "
        f"FROM jsonb_array_elements(${tag}${document}${tag}$::jsonb) AS r"
    )


def _milliseconds(seconds: float) -> int:
    if seconds < 0:
        raise ValueError(f"a PostgreSQL timeout must not be negative, not {seconds:g} s")
    return max(1, round(seconds * 1000)) if seconds else 0


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, _CONNECTION_LOST):
        return True
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return sqlstate[:2] in _UNAVAILABLE_CLASSES
