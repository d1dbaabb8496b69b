"""Writing signed checkpoints while the gateway runs: on an interval, when a run ends, at shutdown.

It follows the committed chain on its own read connection, so proxying never waits for it; when it writes,
what it signs and when it refuses to (a rewritten history): docs/auditing.md, "The gateway writes them".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import Row, select

from usage_ledger.ledger.chain import chain_hash
from usage_ledger.ledger.checkpoint import (
    Checkpoint,
    CheckpointMalformed,
    HeadTracker,
    SignatureRejected,
    SigningKey,
    load_signing_key,
    open_checkpoint,
    sign_checkpoint,
)
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.durable import fsync_dir
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted, decode_event
from usage_ledger.ledger.read import STORED_COLUMNS
from usage_ledger.ledger.schema import events
from usage_ledger.ledger.settings import StorageSettings
from usage_ledger.ledger.verify_ledger import ledger_origin
from usage_ledger.ledger.waiting import wait_up_to

__all__ = ("RUN_IDLE_S", "Checkpointer", "read_checkpoint_notes", "write_checkpoint_file")

log = structlog.get_logger("ledger.checkpointer")

RUN_IDLE_S = 60.0
TICK_S = 5.0
SHUTDOWN_TIMEOUT_S = 10.0
_PAGE = 1_000  # rows per read: each page's rows are converted on the event loop
CHECKPOINT_GLOB = "checkpoint-*.txt"
_WRITTEN_NAME = re.compile(r"checkpoint-\d{12}\.txt")  # the names this module writes


def write_checkpoint_file(path: Path, note: str) -> None:
    """Atomically (temp file, fsync, rename, fsync of the directory)."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(note)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        fsync_dir(path.parent)
    except OSError as exc:
        raise ConfigError(f"cannot write checkpoint {path}: {exc}") from exc


def read_checkpoint_notes(paths: Sequence[Path]) -> list[tuple[str, bytes]]:
    """(name, bytes) of each checkpoint file; a directory stands for its `checkpoint-*.txt` files."""
    notes = []
    for path in paths:
        files = sorted(path.glob(CHECKPOINT_GLOB)) if path.is_dir() else [path]
        for file in files:
            try:
                notes.append((str(file), file.read_bytes()))
            except OSError as exc:
                raise ConfigError(f"cannot read checkpoint {file}: {exc}") from exc
        if not files:
            raise ConfigError(f"no {CHECKPOINT_GLOB} files in {path}")
    return notes


class Checkpointer:
    """Follows the chain and writes `checkpoint-<size>.txt` files into `directory`."""

    def __init__(
        self,
        database: Database,
        key: SigningKey,
        directory: Path,
        *,
        interval_s: float = 300.0,
        origin: str | None = None,
        run_idle_s: float = RUN_IDLE_S,
    ) -> None:
        self.database = database
        self.key = key
        self.directory = directory
        self.interval_s = interval_s
        self.run_idle_s = run_idle_s
        self._origin = origin
        self._tracker = HeadTracker()
        self._started = False  # rows present before the first catch-up are only linked, not re-hashed
        self._written = 0
        self._last_write = time.monotonic()
        self._refused: str | None = None
        self._failing = False
        self._runs: dict[str, float] = {}
        self._call_runs: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(cls, settings: StorageSettings, database: Database) -> Checkpointer | None:
        """None when no key is set; a bad key or directory fails start-up (ConfigError)."""
        if not settings.checkpoint_key:
            return None
        if settings.checkpoint_interval_s <= 0:
            raise ConfigError("LEDGER_CHECKPOINT_INTERVAL_S must be positive")
        key = load_signing_key(Path(settings.checkpoint_key))
        directory = Path(settings.checkpoint_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create LEDGER_CHECKPOINT_DIR {directory}: {exc}") from exc
        return cls(
            database, key, directory, interval_s=settings.checkpoint_interval_s, origin=settings.checkpoint_origin
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="ledger-checkpointer")

    async def close(self) -> None:
        """Stop the loop, then sign the final head (call after the writer has drained)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await wait_up_to(self.tick(final=True), SHUTDOWN_TIMEOUT_S)

    async def _loop(self) -> None:
        tick_s = min(TICK_S, self.interval_s, self.run_idle_s / 2)
        while True:
            await self.tick()
            await asyncio.sleep(tick_s)

    async def tick(self, *, final: bool = False) -> None:
        """Catch up with the chain, then write a checkpoint if one is due. Never raises."""
        if self._refused is not None:
            return
        try:
            await self._catch_up()
            await self._write_if_due(final)
        except Exception as exc:  # a checkpoint never takes the gateway down; the next tick tries again
            # one warning per outage, not one per tick
            (log.debug if self._failing else log.warning)(
                "checkpoint_failed", error=str(exc), error_type=type(exc).__name__
            )
            self._failing = True
        else:
            self._failing = False

    async def _write_if_due(self, final: bool) -> None:
        now = time.monotonic()
        ended = [run for run, seen in self._runs.items() if now - seen >= self.run_idle_s]
        for run in ended:
            del self._runs[run]
        if self._tracker.size == self._written or self._refused is not None:
            return
        reason = "shutdown" if final else "run_ended" if ended else "interval"
        if final or ended or now - self._last_write >= self.interval_s:
            await self._write(reason, ended)

    async def _catch_up(self) -> None:
        start = not self._started
        newest = self._newest_in_directory() if start else None
        async with self.database.engine.connect() as conn:
            if self._origin is None and self._tracker.size == 0:
                with contextlib.suppress(ConfigError):  # still empty: nothing to sign yet
                    self._origin = await ledger_origin(conn)
            while True:
                columns = (events.c.position, events.c.recorded_at, events.c.hash) if start else STORED_COLUMNS
                query = select(*columns).where(events.c.position > self._tracker.size).order_by(events.c.position)
                rows = (await conn.execute(query.limit(_PAGE))).all()
                # hashing and decoding off the event loop, which relays the calls
                if not await asyncio.to_thread(self._accept_page, rows, start, newest):
                    return
                if len(rows) < _PAGE:
                    break
        if start:
            self._started = True
            self._written = newest.size if newest is not None and newest.size == self._tracker.size else 0
            if newest is not None and newest.size > self._tracker.size:
                self._refuse(
                    f"the ledger has {self._tracker.size} events, {self.directory}'s newest checkpoint {newest.size}"
                )

    def _accept_page(self, rows: Sequence[Row[Any]], start: bool, newest: Checkpoint | None) -> bool:
        return all(self._accept(row, start, newest) for row in rows)

    def _accept(self, row: Row[Any], start: bool, newest: Checkpoint | None) -> bool:
        position, recorded_at, stored_hash = row.position, row.recorded_at, row.hash
        if position != self._tracker.size + 1:
            self._refuse(f"position {self._tracker.size + 1} is missing")
            return False
        if not start:
            expected = chain_hash(
                self._tracker.head_hash, position, row.event_id, row.occurred_at, row.type, row.stream, row.payload
            )
            if expected != stored_hash:
                self._refuse(f"position {position} does not chain onto {self._tracker.size}: the ledger was changed")
                return False
            self._note_run(row.type, row.payload)
        self._tracker.add(position, stored_hash, recorded_at)
        if newest is not None and position == newest.size:
            mine = self._tracker.checkpoint(newest.origin)
            if (mine.head_hash, mine.recorded_at_digest) != (newest.head_hash, newest.recorded_at_digest):
                self._refuse(f"the ledger no longer matches {self.directory}'s checkpoint at size {newest.size}")
                return False
        return True

    def _note_run(self, type_: str, payload: str) -> None:
        if type_ not in ("call.started", "call.finished", "call.failed"):
            return
        body = decode_event(payload)
        run = None
        if isinstance(body, CallStarted):
            run = body.run
            if run is not None:
                self._call_runs[body.call_id] = run
        elif isinstance(body, CallFinished | CallFailed):
            run = self._call_runs.pop(body.call_id, None)
        if run is not None:
            self._runs[run] = time.monotonic()

    def _newest_in_directory(self) -> Checkpoint | None:
        """The newest checkpoint this key signed in the directory (names sort by size; older ones
        are implied by it, so a directory of months of them costs one read)."""
        written = [p for p in self.directory.glob(CHECKPOINT_GLOB) if _WRITTEN_NAME.fullmatch(p.name)]
        for path in sorted(written, reverse=True):
            try:
                return open_checkpoint(path.read_bytes(), self.key.verifier, str(path))
            except (CheckpointMalformed, SignatureRejected, OSError) as exc:
                log.warning("checkpoint_unreadable", path=str(path), error=str(exc))
        return None

    def _refuse(self, why: str) -> None:
        self._refused = why
        log.error("checkpoint_refused", reason=why, directory=str(self.directory), action="run ledger verify")

    async def _write(self, reason: str, ended: list[str]) -> None:
        if self._origin is None:
            return
        checkpoint = self._tracker.checkpoint(self._origin)
        note = sign_checkpoint(checkpoint, self.key)
        path = self.directory / f"checkpoint-{checkpoint.size:012d}.txt"
        await asyncio.to_thread(write_checkpoint_file, path, note)
        self._written = checkpoint.size
        self._last_write = time.monotonic()
        log.info("checkpoint_written", path=str(path), size=checkpoint.size, reason=reason, runs=ended)
