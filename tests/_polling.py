"""Waiting for a condition with a deadline, where a fixed sleep would guess: too long on a quiet machine, too
short on a loaded one (the 2-core box runs the suite beside other work)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ("wait_until", "wait_until_sync")

T = TypeVar("T")


async def wait_until(
    condition: Callable[[], T | Awaitable[T]], *, timeout_s: float = 30.0, every_s: float = 0.01, what: str = ""
) -> T:
    """Until `condition()` (a function or a coroutine function) gives something true; returns it. After
    `timeout_s` an AssertionError says `what` was awaited and the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"not so after {timeout_s} s: {what or condition} (last: {value!r})")
        await asyncio.sleep(every_s)


def wait_until_sync(condition: Callable[[], T], *, timeout_s: float = 30.0, every_s: float = 0.01, what: str = "") -> T:
    """`wait_until` for a test without a running loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not so after {timeout_s} s: {what or condition} (last: {value!r})")
        time.sleep(every_s)
