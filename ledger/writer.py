"""Group commit: many producers, one writer task, one transaction per batch, spool on outage.

    producer ─ submit(events, bodies) ─► queue ─► writer task ─► append_events (one transaction)
                                                       └─ database unavailable ─► spool (fsync)
                                                          replayed in order once it answers again

`append()` returns once the events are durable: committed, or fsync'd to the spool. While the
spool holds anything, new batches go to the spool too, so events reach the database in order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog

from ledger.append import AppendResult, append_events
from ledger.blobs import BlobCompressor, PreparedBlob
from ledger.db import Database
from ledger.errors import DatabaseUnavailable, LedgerError
from ledger.events import NewEvent
from ledger.spool import Spool, SpoolRecord

__all__ = ("Durable", "EventWriter", "replay_spool")

Durable = Literal["committed", "spooled"]
log = structlog.get_logger("ledger.writer")

INLINE_COMPRESS_BYTES = 16 * 1024
"""Bodies of a batch up to this size are compressed on the loop (tens of µs); a thread hop costs more."""


@dataclass(slots=True)
class _Entry:
    events: Sequence[NewEvent]
    bodies: Mapping[str, bytes]
    done: asyncio.Future[Durable] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


async def replay_spool(database: Database, spool: Spool, batch_max_events: int = 5000) -> tuple[int, int]:
    """Append every spooled record in order, then empty the spool. Returns (appended, duplicates).

    Safe to repeat: events already in the database (by event id) are skipped.
    """
    scan = spool.scan()
    if scan.torn_tail_at is not None:
        log.warning(
            "spool_torn_tail_dropped", path=str(spool.path), offset=scan.torn_tail_at, bytes=scan.torn_tail_bytes
        )
    appended = duplicates = 0
    events: list[NewEvent] = []
    blobs: list[PreparedBlob] = []
    for index, record in enumerate(scan.records):
        events.extend(record.events)
        blobs.extend(record.blobs)
        if len(events) >= batch_max_events or index == len(scan.records) - 1:
            result = await append_events(database, events, blobs)
            appended += result.appended
            duplicates += result.duplicates
            events, blobs = [], []
    spool.clear()
    return appended, duplicates


class EventWriter:
    """The single writer of one process. Use as an async context manager."""

    def __init__(
        self,
        database: Database,
        spool: Spool | None = None,
        *,
        batch_max_events: int = 2000,
        retry_interval_s: float = 1.0,
    ) -> None:
        self.database = database
        self.spool = spool
        self.batch_max_events = batch_max_events
        self.retry_interval_s = retry_interval_s
        self.last_position = 0
        self.committed_events = 0
        self.spooled_events = 0
        self._queue: asyncio.Queue[_Entry | None] = asyncio.Queue()
        self._compressor = BlobCompressor()
        self._task: asyncio.Task[None] | None = None
        self._spooling = False
        self._next_retry = 0.0
        self._listeners: list[Callable[[int], None]] = []

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.spool is not None:
            self.spool.open()
            scan = self.spool.scan()
            if scan.torn_tail_at is not None:
                log.warning("spool_torn_tail_dropped", path=str(self.spool.path), offset=scan.torn_tail_at)
                self.spool.cut_torn_tail(scan.torn_tail_at)
            if scan.records:
                self._spooling = True
                await self._try_replay()
        self._task = asyncio.create_task(self._run(), name="ledger-writer")

    async def close(self) -> None:
        """Write everything queued, then stop. Nothing submitted before close is dropped."""
        if self._task is not None:
            await self._queue.put(None)
            await self._task
            self._task = None
        if self.spool is not None:
            if self._spooling:
                self._next_retry = 0.0  # one last attempt now, whatever the retry timer says
                await self._try_replay()
            self.spool.close()

    async def __aenter__(self) -> EventWriter:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- producers -------------------------------------------------------------------------------
    def submit(self, events: Sequence[NewEvent], bodies: Mapping[str, bytes] | None = None) -> asyncio.Future[Durable]:
        """Queue events (and the bodies they reference, by hash); the future resolves when durable."""
        entry = _Entry(events, bodies or {})
        self._queue.put_nowait(entry)
        return entry.done

    async def append(self, events: Sequence[NewEvent], bodies: Mapping[str, bytes] | None = None) -> Durable:
        return await self.submit(events, bodies)

    def on_commit(self, listener: Callable[[int], None]) -> None:
        """Call `listener(last_position)` after every commit (e.g. to wake a projection)."""
        self._listeners.append(listener)

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def spool_bytes(self) -> int:
        return self.spool.size_bytes if self.spool is not None else 0

    @property
    def spooling(self) -> bool:
        return self._spooling

    # -- the writer task -------------------------------------------------------------------------
    async def _run(self) -> None:
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                break
            batch = [first]
            count = len(first.events)
            while count < self.batch_max_events and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stopping = True
                    break
                batch.append(item)
                count += len(item.events)
            await self._write(batch)

    async def _write(self, batch: list[_Entry]) -> None:
        events = [event for entry in batch for event in entry.events]
        bodies = [entry.bodies for entry in batch if entry.bodies]
        # zstd releases the GIL: compress large batches on a worker thread, not on the proxy's event loop
        blobs: list[PreparedBlob] = []
        if bodies:
            size = sum(len(data) for mapping in bodies for data in mapping.values())
            if size <= INLINE_COMPRESS_BYTES:
                blobs = self._prepare(bodies)
            else:
                blobs = await asyncio.to_thread(self._prepare, bodies)
        outcome: Durable
        try:
            if self._spooling and not await self._try_replay():
                raise DatabaseUnavailable("still spooling")
            result = await append_events(self.database, events, blobs)
            self._committed(result, blobs)
            outcome = "committed"
        except LedgerError as exc:
            if self.spool is None:
                for entry in batch:
                    if not entry.done.done():
                        entry.done.set_exception(exc)
                return
            if not self._spooling:
                log.warning("ledger_unavailable_spooling", error=str(exc), spool=str(self.spool.path))
                self._spooling = True
                self._next_retry = time.monotonic() + self.retry_interval_s
                self._compressor.forget()
            try:
                self.spool.write(SpoolRecord(events=events, blobs=blobs))
            except OSError as spool_exc:
                log.error("spool_write_failed", error=str(spool_exc), spool=str(self.spool.path))
                for entry in batch:
                    if not entry.done.done():
                        entry.done.set_exception(spool_exc)
                return
            self.spooled_events += len(events)
            outcome = "spooled"
        for entry in batch:
            if not entry.done.done():
                entry.done.set_result(outcome)

    def _prepare(self, bodies: list[Mapping[str, bytes]]) -> list[PreparedBlob]:
        prepared: list[PreparedBlob] = []
        seen: set[str] = set()
        for mapping in bodies:
            for digest, data in mapping.items():
                if digest in seen:
                    continue
                seen.add(digest)
                blob = self._compressor.prepare(data, digest)
                if blob is not None:
                    prepared.append(blob)
        return prepared

    def _committed(self, result: AppendResult, blobs: list[PreparedBlob]) -> None:
        self._compressor.remember(blob.hash for blob in blobs)
        self.committed_events += result.appended
        if result.appended:
            self.last_position = result.last_position
            for listener in self._listeners:
                listener(result.last_position)

    async def _try_replay(self) -> bool:
        """Drain the spool into the database; False (and stay spooling) while it is unreachable."""
        assert self.spool is not None
        now = time.monotonic()
        if now < self._next_retry:
            return False
        try:
            appended, duplicates = await replay_spool(self.database, self.spool, self.batch_max_events)
        except LedgerError as exc:
            self._next_retry = now + self.retry_interval_s
            log.debug("spool_replay_deferred", error=str(exc))
            return False
        self._spooling = False
        log.info("spool_replayed", appended=appended, duplicates=duplicates)
        return True
