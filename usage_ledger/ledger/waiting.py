"""Waiting for something with a time limit, without losing a cancel that arrives meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

__all__ = ("wait_up_to",)


async def wait_up_to(awaitable: Awaitable[object], seconds: float) -> bool:
    """Await `awaitable` for at most `seconds`; True if it finished in time (it is cancelled if not).

    Not `asyncio.wait_for`: on Python 3.11, a cancel that reaches it just after what it awaits has
    finished (an `Event` set a moment before) is dropped and the result returned instead. A
    follower cancelled then ran on forever, and a CI run hung on it. `asyncio.timeout` tells its own
    expiry from a cancel and re-raises the cancel.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await awaitable
            return True
    return False
