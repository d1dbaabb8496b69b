"""Turning a proxied call into ledger events, and honouring the durability setting.

`call.started` is submitted once the request body is complete; the final event (`call.finished` /
`call.failed`) is submitted with the response body and the chunk gaps as blobs, in the same submission
(one transaction, or one spool record). With strict durability the proxy awaits `call.started`
(`until_durable`) before it forwards the request, so no call reaches the upstream without its record and
a call cut by a crash survives as started-not-finished; it awaits `finish()` before releasing the
response's last bytes. With async it waits for neither (`call.started` goes out once the request did).
Group commit in the `EventWriter` batches concurrent calls into one transaction.

When strict and an event cannot be made durable anywhere, `until_durable` / `finish()` raise `NotRecorded`:
the proxy answers 503 `ledger_unavailable` before forwarding, or drops the connection before the last bytes
(docs/operations.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import Protocol

import structlog

from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.settings import Durability
from usage_ledger.ledger import CallFailed, CallFinished, CallStarted, Durable, EventWriter, call_stream, new_event

__all__ = ("CallWatcher", "NotRecorded", "Recorder", "new_call_id")

log = structlog.get_logger("gateway.recorder")


def new_call_id() -> str:
    """A short, time-ordered unique id: 12 hex digits of Unix milliseconds + 16 random hex digits."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(8).hex()}"


class NotRecorded(Exception):
    """Strict durability: the call's final event is durable nowhere (already logged and counted)."""


class CallWatcher(Protocol):
    """Told when a recorded call starts and ends (the server sampler marks run boundaries with it)."""

    def call_started(self, call_id: str, run: str | None) -> None: ...

    def call_ended(self, call_id: str) -> None: ...


class Recorder:
    def __init__(self, writer: EventWriter, durability: Durability, metrics: Metrics) -> None:
        self.writer = writer
        self.strict = durability == "strict"
        self.metrics = metrics
        self.watcher: CallWatcher | None = None

    @staticmethod
    def digest(body: bytes) -> str:
        return hashlib.sha256(body).hexdigest()

    def started(self, event: CallStarted, body: bytes | None) -> asyncio.Future[Durable]:
        bodies = {event.request_blob: body} if event.request_blob and body is not None else None
        future = self.writer.submit([new_event(event, stream=call_stream(event.call_id))], bodies)
        future.add_done_callback(self._check)
        if self.watcher is not None:
            self.watcher.call_started(event.call_id, event.run)
        return future

    async def until_durable(self, future: asyncio.Future[Durable]) -> None:
        """With strict durability, wait for a submitted event; `NotRecorded` if it is durable nowhere (neither
        committed nor spooled: its failure is logged and counted by `_check`)."""
        if not self.strict:
            return
        try:
            await asyncio.shield(future)
        except Exception as exc:  # (a cancellation is no Exception: it propagates)
            raise NotRecorded(str(exc)) from exc

    async def finish(
        self, event: CallFinished | CallFailed, body: bytes | None, gaps: bytes | None = None, *, wait: bool = True
    ) -> None:
        """Submit the final event with the blobs it names (`body`: `response_blob`, `gaps`: `chunk_gaps_blob`);
        with strict durability (and `wait`) return once it is durable, or raise `NotRecorded` if it cannot be."""
        bodies: dict[str, bytes] = {}
        if event.response_blob and body is not None:
            bodies[event.response_blob] = body
        if event.chunk_gaps_blob and gaps is not None:
            bodies[event.chunk_gaps_blob] = gaps
        future = self.writer.submit([new_event(event, stream=call_stream(event.call_id))], bodies or None)
        if self.watcher is not None:
            self.watcher.call_ended(event.call_id)
        if not (self.strict and wait):
            future.add_done_callback(self._check)
            return
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._check)
            raise
        except Exception as exc:
            # Durable nowhere, not even in the spool: counted, logged, and the caller must not let
            # the client take the response for a recorded one.
            self.metrics.record_failures += 1
            log.error("call_record_failed", call_id=event.call_id, error=str(exc))
            raise NotRecorded(str(exc)) from exc

    def _check(self, future: asyncio.Future[Durable]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self.metrics.record_failures += 1
            log.error("call_record_failed", error=str(exc))
