"""Appending events: one transaction per batch, serialized, gap-free, idempotent, hash-chained.

Serialization: each backend's appender runs the whole batch on its own thread under the ledger's write lock
(`sqlite_append`, `pg_append`), so commit order = position order and a reader at `position > checkpoint`
never skips an event.

`appending` is the same append over many batches in one transaction (a file of `ledger import`:
all of it or none, also across a kill, while memory holds one batch). Each batch is chained by the
backend's one insert path as `append_events` does; the lock is held from the first batch to the
commit, so every other appender (a gateway) waits that long: keep what happens between batches short.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence

import msgspec
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from usage_ledger.ledger.backend import AppenderStream
from usage_ledger.ledger.blobs import PreparedBlob
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError, first_line
from usage_ledger.ledger.events import NewEvent, utc_now

__all__ = ("AppendResult", "AppendStream", "append_events", "appending", "as_ledger_errors", "translate_db_error")


class AppendResult(msgspec.Struct, frozen=True):
    appended: int
    duplicates: int
    last_position: int


async def append_events(
    database: Database, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob] = ()
) -> AppendResult:
    """Append `batch` (and the bodies it references) in one transaction."""
    with as_ledger_errors(database):
        appended, duplicates, last = await database.appender.append(batch, blobs, utc_now())
    return AppendResult(appended=appended, duplicates=duplicates, last_position=last)


class AppendStream:
    """The batches of one `appending` block; its totals are final once the block has committed."""

    def __init__(self, backend: AppenderStream, database: Database) -> None:
        self._backend = backend
        self._database = database
        self._failed = False
        self.appended = 0
        self.duplicates = 0
        self.last_position = 0

    async def add(self, batch: Sequence[NewEvent]) -> AppendResult:
        """Chain `batch` after the block's earlier batches (uncommitted until the block ends).

        After a failure the block's transaction is gone: every later `add` fails too, and nothing is appended.
        """
        if self._failed:
            raise LedgerError(f"append to {self._database.safe_url} failed earlier in this transaction")
        try:
            appended, duplicates, last = await self._backend.add(batch, utc_now())
        except BaseException as exc:
            self._failed = True
            if isinstance(exc, Exception):
                raise translate_db_error(exc, self._database) from exc
            raise
        self.appended += appended
        self.duplicates += duplicates
        self.last_position = last
        return AppendResult(appended=appended, duplicates=duplicates, last_position=last)

    @property
    def result(self) -> AppendResult:
        return AppendResult(appended=self.appended, duplicates=self.duplicates, last_position=self.last_position)


@contextlib.asynccontextmanager
async def appending(database: Database) -> AsyncIterator[AppendStream]:
    """One transaction for the batches `add`ed inside the block: committed when the block ends, rolled back
    when it raises (or the process dies first). The write lock (SQLite) or the chain's head (PostgreSQL) is
    held from the first batch (SQLite: from the start) to the commit; other appends wait for it."""
    with as_ledger_errors(database):
        backend = await database.appender.stream()
    try:
        yield AppendStream(backend, database)
        with as_ledger_errors(database):
            await backend.commit()
    finally:
        backend.close()


@contextlib.contextmanager
def as_ledger_errors(database: Database) -> Iterator[None]:
    """Failures raised inside as the ledger's errors (`translate_db_error`); the ledger's own pass as they are."""
    try:
        yield
    except LedgerError:
        raise
    except Exception as exc:
        raise translate_db_error(exc, database) from exc


def translate_db_error(exc: BaseException, database: Database) -> LedgerError:
    """Map driver and network failures to the ledger's errors (once, at this boundary)."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, OperationalError | InterfaceError | OSError | ConnectionError | asyncio.TimeoutError):
        return DatabaseUnavailable(f"database {database.safe_url} unavailable: {first_line(exc)}")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return DatabaseUnavailable(f"database {database.safe_url} connection lost: {first_line(exc)}")
    return LedgerError(f"append to {database.safe_url} failed: {first_line(exc)}")
