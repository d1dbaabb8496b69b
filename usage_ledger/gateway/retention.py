"""`ledger serve --keep-bodies DAYS`: erase the bodies of calls older than DAYS, now and then, beside the calls.

Which bodies are old is a question for the read models, which the gateway does not import: the composition
hands in `EraseOlder` (the same erasure as `ledger redact --before`). Passes, batches, logs and metrics:
docs/operations.md, "Retention of bodies".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec
import structlog

from usage_ledger.gateway.metrics import Metrics
from usage_ledger.ledger import Database

__all__ = ("EraseOlder", "RetentionPass", "keep_bodies")

log = structlog.get_logger("gateway.retention")


class RetentionPass(msgspec.Struct, frozen=True, kw_only=True):
    erased: int
    stored_bytes: int
    kept_shared: int


EraseOlder = Callable[[Database, float, Callable[[int], None]], Awaitable[RetentionPass]]
"""(database, days, called with each batch's count of erased bodies) → what the pass did."""


async def keep_bodies(database: Database, days: float, interval_s: float, erase: EraseOlder, metrics: Metrics) -> None:
    """Erase bodies older than `days` at start and every `interval_s`, until cancelled."""

    def counted(erased: int) -> None:
        metrics.bodies_erased += erased

    while True:
        started = time.monotonic()
        try:
            done = await erase(database, days, counted)
        except Exception as exc:  # the database away, a lock timeout: the next pass resumes
            metrics.retention_failures += 1
            log.warning("bodies_erase_failed", keep_days=days, error=str(exc) or type(exc).__name__)
        else:
            metrics.retention_passes += 1
            log.info(
                "bodies_erased",
                keep_days=days,
                erased=done.erased,
                stored_bytes=done.stored_bytes,
                kept_shared=done.kept_shared,
                seconds=round(time.monotonic() - started, 3),
            )
        await asyncio.sleep(interval_s)
