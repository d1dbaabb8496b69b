"""Group commit: many producers, one writer task, one transaction per batch, spool on outage.

    producer ─ submit(events, bodies) ─► queue ─► writer task ─► append_events (one transaction)
                                                       └─ database unavailable ─► spool (fsync)
                                                          replayed in order once it answers again
                                                          (retried on a timer, with or without traffic)

`append()` returns once the events are durable: committed, or fsync'd to the spool. While the
spool holds anything, new batches go to the spool too, so events reach the database in order.
"""

from __future__ import annotations

import asyncio
import os
import time
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Literal

import structlog

from usage_ledger.ledger.append import AppendResult, append_events
from usage_ledger.ledger.blobs import BlobCompressor, PreparedBlob
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError, SpoolCorrupt, SpoolWriteFailed
from usage_ledger.ledger.events import NewEvent
from usage_ledger.ledger.spool import Spool, SpoolRecord, SpoolScan

__all__ = ("Durable", "EventWriter", "replay_spool", "report_damage")

Durable = Literal["committed", "spooled"]
log = structlog.get_logger("ledger.writer")
_RESOLVE_SLICE = 256  # futures resolved per event-loop turn
LOW_DISK_BYTES = 64 * 1024 * 1024
"""Free space under which the spool's or the SQLite ledger's file system makes the writer report trouble."""
SLOW_APPEND_S = 1.0
"""An append (or spool replay) waiting longer than this makes the writer report trouble while it waits: a healthy
one takes milliseconds; a long wait is a database that hangs or a head held by a stopped appender."""
INLINE_COMPRESS_BYTES = 16 * 1024
"""Bodies of a batch up to this size are compressed on the loop (tens of µs); a thread hop costs more."""


async def replay_spool(
    database: Database,
    spool: Spool,
    batch_max_events: int = 5000,
    *,
    quarantine: bool = False,
    accept_unkeyed: bool = False,
) -> tuple[int, int]:
    """Append every spooled record in order, then empty the spool. Returns (appended, duplicates).

    Safe to repeat: events already in the database (by event id) are skipped. A damaged region
    before the end raises `SpoolCorrupt` (the file is left as it was) unless `quarantine`, where it
    is moved to a side file, logged, and the valid records around it are replayed. A record without
    the spool's key is damage unless `accept_unkeyed` (asked for by name: `--accept-unkeyed`), where it
    is replayed with a warning.
    """
    if quarantine:
        scan = spool.recover(accept_unkeyed=accept_unkeyed)
    else:
        scan = spool.scan(accept_unkeyed=accept_unkeyed)
        if scan.damaged:
            first = scan.damaged[0]
            raise SpoolCorrupt(
                f"{spool.path}: record at byte {first.offset} {first.reason}; the spool needs inspection"
            )
    report_damage(spool, scan)
    if scan.unkeyed:
        log.warning(
            "spool_unkeyed_records_replayed",
            path=str(spool.path),
            records=scan.unkeyed,
            detail="records without the spool's key, replayed because --accept-unkeyed asked for it",
        )
    appended = duplicates = 0
    events: list[NewEvent] = []
    blobs: list[PreparedBlob] = []
    for index, record in enumerate(scan.records):
        events.extend(record.events)
        blobs.extend(record.blobs)
        if (len(events) >= batch_max_events or index == len(scan.records) - 1) and (events or blobs):
            result = await append_events(database, events, blobs)
            appended += result.appended
            duplicates += result.duplicates
            events, blobs = [], []
    spool.clear()
    return appended, duplicates


def report_damage(spool: Spool, scan: SpoolScan) -> None:
    """Log (warning) what a scan leaves out: a torn tail, and each region `Spool.recover` quarantined (a record
    from another ledger, forged or unkeyed among them)."""
    if scan.torn_tail_at is not None:
        log.warning(
            "spool_torn_tail_dropped", path=str(spool.path), offset=scan.torn_tail_at, bytes=scan.torn_tail_bytes
        )
    for damage in scan.damaged:
        log.warning(
            "spool_region_quarantined",
            path=str(spool.path),
            offset=damage.offset,
            bytes=damage.size,
            reason=damage.reason,
            quarantine_dir=str(spool.directory),
        )


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
        self._failing: str | None = None  # why the latest batch could be neither committed nor spooled
        # Submissions waiting for the writer task, as parallel lists (the gateway submits once per
        # call: no per-submission object but its future, which keeps full GC passes rare):
        # every event in order; per submission its future, its bodies and where its events end.
        self._events: list[NewEvent] = []
        self._done: list[asyncio.Future[Durable]] = []
        self._bodies: list[Mapping[str, bytes] | None] = []
        self._ends: list[int] = []
        self._wakeup: asyncio.Future[None] | None = None  # set while the writer task waits for work
        self._closing = False
        self._compressor = BlobCompressor()
        self._task: asyncio.Task[None] | None = None
        self._spooling = False
        self._next_retry = 0.0
        self._unavailable: str | None = None  # why the spool cannot be replayed yet (while spooling)
        self._appending_since: float | None = None  # monotonic start of the database write under way, if any

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.spool is not None:
            self.spool.open()
            try:
                scan = self.spool.recover()  # never blocks the start: damage goes to quarantine files
                report_damage(self.spool, scan)
            except OSError as exc:  # no room for the quarantine files: the timed replay tries again
                log.warning("spool_recovery_failed", error=str(exc), spool=str(self.spool.path))
                scan = self.spool.scan()
            if scan.records:
                self._spooling = True
                self._unavailable = "the spool holds events from before the start"
                await self._try_replay()
        self._task = asyncio.create_task(self._run(), name="ledger-writer")

    async def close(self) -> None:
        """Write everything queued, then stop. Nothing submitted before close is dropped."""
        if self._task is not None:
            self._closing = True
            self._wake()
            await self._task
            self._task = None
            self._closing = False
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
        done: asyncio.Future[Durable] = asyncio.get_running_loop().create_future()
        self._events.extend(events)
        self._ends.append(len(self._events))
        self._done.append(done)
        self._bodies.append(bodies or None)
        if self._wakeup is not None:
            self._wake()
        return done

    async def append(self, events: Sequence[NewEvent], bodies: Mapping[str, bytes] | None = None) -> Durable:
        return await self.submit(events, bodies)

    @property
    def queue_depth(self) -> int:
        return len(self._done)

    @property
    def spool_bytes(self) -> int:
        return self.spool.size_bytes if self.spool is not None else 0

    @property
    def spooling(self) -> bool:
        return self._spooling

    @property
    def problems(self) -> list[str]:
        """Why the ledger is not fully healthy: the latest events could not be recorded at all, the disk is
        nearly full, the spool cannot be replayed, or it holds quarantined damage."""
        found: list[str] = []
        since = self._appending_since
        if since is not None and (waited := time.monotonic() - since) > SLOW_APPEND_S:
            found.append(
                f"an append has waited {waited:.1f} s for the database (unreachable, or the chain's head held by "
                "another appender)"
            )
        if self._failing is not None:
            found.append(f"events cannot be recorded: {self._failing}")
        found += [
            f"{what} {where}: {free // (1024 * 1024)} MiB free (under {LOW_DISK_BYTES // (1024 * 1024)} MiB)"
            for what, where, free in self._low_disks()
        ]
        if self._spooling:
            found.append(f"spool cannot be replayed yet: {self._unavailable or 'database unavailable'}")
        if self.spool is not None:
            quarantined = self.spool.quarantined()
            if quarantined:
                names = ", ".join(p.name for p in quarantined)
                found.append(
                    f"{len(quarantined)} damaged spool region(s) quarantined in {self.spool.directory} ({names}): "
                    "inspect them, then move them out of the spool directory"
                )
        return found

    def _low_disks(self) -> list[tuple[str, str, int]]:
        """(what, where, free bytes) for each place the writer writes to whose file system is nearly full."""
        places: list[tuple[str, str]] = []
        if self.spool is not None:
            places.append(("spool", str(self.spool.directory)))
        ledger_file = self.database.backend_ops.ledger_file(self.database.engine.url)
        if ledger_file:
            places.append(("ledger", os.path.dirname(os.path.abspath(ledger_file))))
        low = []
        for what, where in places:
            try:
                stats = os.statvfs(where)
            except OSError:
                continue
            free = stats.f_bavail * stats.f_frsize
            if free < LOW_DISK_BYTES:
                low.append((what, where, free))
        return low

    # -- the writer task -------------------------------------------------------------------------
    def _wake(self) -> None:
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _run(self) -> None:
        while True:
            if not self._done:
                if self._closing:
                    return
                rechecking = self._failing is not None and self.spool is not None
                if rechecking:
                    self._recheck()
                timeout: float | None = None  # until the next submission
                if self._spooling:  # no traffic: replay on the retry timer, not on the next request
                    if await self._try_replay():
                        continue
                    timeout = max(0.0, self._next_retry - time.monotonic())
                elif rechecking:  # health recovers without traffic: look again on the retry timer
                    timeout = self.retry_interval_s
                self._wakeup = asyncio.get_running_loop().create_future()
                await asyncio.wait([self._wakeup], timeout=timeout)
                self._wakeup = None
                continue
            await self._write(*self._take_batch())

    def _recheck(self) -> None:
        """After events could be neither committed nor spooled (a full disk): once the spool takes a write
        again, events can be recorded again (spooled at worst), so health stops saying they cannot."""
        assert self.spool is not None
        try:
            self.spool.probe()
        except (OSError, SpoolWriteFailed):
            return
        log.info("ledger_recording_recovered", was=self._failing)
        self._failing = None

    def _take_batch(
        self,
    ) -> tuple[list[NewEvent], list[Mapping[str, bytes]], list[asyncio.Future[Durable]]]:
        """Whole submissions, oldest first, up to `batch_max_events` (at least one submission)."""
        ends = self._ends
        if ends[-1] <= self.batch_max_events:  # everything waiting fits: take the lists as they are
            events, done, bodies = self._events, self._done, self._bodies
            self._events, self._done, self._bodies, self._ends = [], [], [], []
        else:
            taken = max(1, bisect_right(ends, self.batch_max_events))
            count = ends[taken - 1]
            events, done, bodies = self._events[:count], self._done[:taken], self._bodies[:taken]
            del self._events[:count], self._done[:taken], self._bodies[:taken]
            self._ends = [end - count for end in ends[taken:]]
        return events, [b for b in bodies if b], done

    async def _write(
        self, events: list[NewEvent], bodies: list[Mapping[str, bytes]], done: list[asyncio.Future[Durable]]
    ) -> None:
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
            self._appending_since = time.monotonic()
            try:
                result = await append_events(self.database, events, blobs)
            finally:
                self._appending_since = None
            self._committed(result, blobs)
            outcome = "committed"
        except LedgerError as exc:
            if self.spool is None:
                self._failing = str(exc)
                await self._resolve(done, exc)
                return
            if not self._spooling:
                log.warning("ledger_unavailable_spooling", error=str(exc), spool=str(self.spool.path))
                self._spooling = True
                self._unavailable = f"database unavailable: {exc}"
                self._next_retry = time.monotonic() + self.retry_interval_s
                self._compressor.forget()
            try:
                self.spool.write(SpoolRecord(events=events, blobs=blobs))
            except (OSError, SpoolWriteFailed) as spool_exc:
                log.error("spool_write_failed", error=str(spool_exc), spool=str(self.spool.path))
                self._failing = f"{exc}; and the spool: {spool_exc}"
                await self._resolve(done, spool_exc)
                return
            self.spooled_events += len(events)
            outcome = "spooled"
        self._failing = None
        await self._resolve(done, outcome)

    @staticmethod
    async def _resolve(done: list[asyncio.Future[Durable]], outcome: Durable | BaseException) -> None:
        """Resolve every submission of a batch (a caller may have cancelled its own future).

        In slices, letting the loop run each slice's wake-ups before the next: every resolved
        future schedules its awaiter's callback, and thousands of them pending at once would
        outlive young-generation GC passes and trigger full collections of the whole heap.
        """
        for start in range(0, len(done), _RESOLVE_SLICE):
            if start:
                await asyncio.sleep(0)
            for future in done[start : start + _RESOLVE_SLICE]:
                if not future.done():
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)

    def _prepare(self, bodies: list[Mapping[str, bytes]]) -> list[PreparedBlob]:
        unique: dict[str, bytes] = {}
        for mapping in bodies:
            for digest, data in mapping.items():
                unique.setdefault(digest, data)
        return [blob for digest, data in unique.items() if (blob := self._compressor.prepare(data, digest)) is not None]

    def _committed(self, result: AppendResult, blobs: list[PreparedBlob]) -> None:
        self._compressor.remember(blob.hash for blob in blobs)
        self.committed_events += result.appended
        if result.appended:
            self.last_position = result.last_position

    async def _try_replay(self) -> bool:
        """Drain the spool into the database; False (and stay spooling) while it is unreachable."""
        assert self.spool is not None
        now = time.monotonic()
        if now < self._next_retry:
            return False
        self._appending_since = now
        try:
            appended, duplicates = await replay_spool(self.database, self.spool, self.batch_max_events, quarantine=True)
        except (LedgerError, OSError) as exc:
            self._next_retry = time.monotonic() + self.retry_interval_s
            reason = f"database unavailable: {exc}" if isinstance(exc, LedgerError) else f"spool unreadable: {exc}"
            if reason != self._unavailable:  # a warning per new reason, not one per retry
                log.warning("spool_replay_deferred", reason=reason, spool=str(self.spool.path))
            else:
                log.debug("spool_replay_deferred", reason=reason)
            self._unavailable = reason
            return False
        finally:
            self._appending_since = None
        self._spooling = False
        self._unavailable = None
        log.info("spool_replayed", appended=appended, duplicates=duplicates)
        return True
