"""The follower coroutine (for `ledger serve`): applies events as they commit."""

from __future__ import annotations

import asyncio
import contextlib

from ledger.db import Database
from projections.engine import follow_projections, projection_status
from tests.projections.helpers import append, finished, started


async def test_follow_applies_new_events(database: Database) -> None:
    wake = asyncio.Event()
    task = asyncio.create_task(follow_projections(database, wake, poll_interval_s=5.0))
    try:
        await append(database, started("a", 0, run="r"), finished("a", 0, 3))
        wake.set()
        for _ in range(200):
            status = {s.name: s for s in await projection_status(database)}
            if status["calls"].checkpoint == 2:
                break
            await asyncio.sleep(0.05)
        assert status["calls"].lag == 0 and status["calls"].live
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
