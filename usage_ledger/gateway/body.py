"""Reading a request body under the limits: its size, the bytes all bodies hold at once, and its pace.

    too large     Content-Length or the bytes so far over `max_body_bytes` → 413
    budget full   all bodies being received hold `max_request_bytes_in_flight` → 503 `gateway_busy`
    too slow      a pause longer than `body_timeout_s`, or, once `BODY_RATE_GRACE_S` passed, fewer
                  bytes than `min_body_rate` per second since the head → 408 (a byte every few
                  seconds no longer keeps a connection, and its slot, forever)

A body refused this way never reached the upstream: no call is recorded. The connection closes
after the answer (the rest of the body is not read).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from usage_ledger.gateway.errors import BodyTooLarge, GatewayBusy, RequestTimeout
from usage_ledger.gateway.headers import Header
from usage_ledger.gateway.limits import ByteBudget, ServerLimits
from usage_ledger.gateway.metrics import Metrics

__all__ = ("BODY_RATE_GRACE_S", "ClientGone", "read_body")

BODY_RATE_GRACE_S = 10.0
"""From the end of the head, the time a body has before its average pace counts (`min_body_rate`)."""

AsgiReceive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class ClientGone(Exception):
    """The client closed the connection before its request body was complete."""


def declared_length(headers: list[Header]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def read_body(
    headers: list[Header], receive: AsgiReceive, limits: ServerLimits, budget: ByteBudget, metrics: Metrics
) -> tuple[bytes, int]:
    """The whole body and the bytes of `budget` it holds (the caller gives them back when done)."""
    limit = limits.max_body_bytes
    declared = declared_length(headers)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = held = 0
    loop = asyncio.get_running_loop()
    start = last = loop.time()
    try:
        while True:
            message = await _next(receive, loop, start, last, size, limits)
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            if chunk:
                last = loop.time()
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                if not budget.take(len(chunk)):
                    metrics.requests_refused_busy += 1
                    raise GatewayBusy(
                        f"the gateway holds {budget.limit} bytes of request bodies already "
                        "(LEDGER_MAX_REQUEST_BYTES_IN_FLIGHT); retry shortly"
                    )
                held += len(chunk)
                parts.append(chunk)
            if not message.get("more_body", False):
                return (parts[0] if len(parts) == 1 else b"".join(parts)), held
    except BaseException:
        budget.give_back(held)
        raise


async def _next(
    receive: AsgiReceive, loop: asyncio.AbstractEventLoop, start: float, last: float, size: int, limits: ServerLimits
) -> MutableMapping[str, Any]:
    """The next body message, within the pause and pace limits."""
    pause_due = last + limits.body_timeout_s
    rate = limits.min_body_rate
    pace_due = start + BODY_RATE_GRACE_S + (size + 1) / rate if rate else pause_due
    due = min(pause_due, pace_due)
    try:
        async with asyncio.timeout_at(due):
            return await receive()
    except TimeoutError:
        pass
    if due == pause_due:
        raise RequestTimeout(
            f"the request body stalled: no bytes for {limits.body_timeout_s:g} s (LEDGER_BODY_TIMEOUT_S); "
            "the call was not made"
        ) from None
    raise RequestTimeout(
        f"the request body arrived slower than {rate} bytes/s (LEDGER_MIN_BODY_RATE): {size} bytes in "
        f"{loop.time() - start:.0f} s; the call was not made"
    ) from None


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"the request body exceeds {limit} bytes (LEDGER_MAX_BODY_BYTES)")
