"""What slow or large traffic may hold of the gateway: connections, time, and memory for bodies.

    ServerLimits   the server's timeouts, connection cap and body pace (`gateway._http`);
                   the cap, unless set, is derived from the process's file-descriptor limit
    ByteBudget     bytes held across all calls at once: request bodies being received (over it: 503),
                   response bodies kept for their blobs (over it: the blob is not stored, `gateway.kept`)

Defaults and their reasons are in docs/configuration.md ("Limits for slow and large traffic").
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from usage_ledger.gateway.settings import GatewaySettings

__all__ = (
    "BODY_RATE_GRACE_S",
    "FD_RESERVE",
    "LINGERING_MAX",
    "MAX_HEAD_BYTES",
    "ByteBudget",
    "ServerLimits",
    "derived_max_connections",
)

MAX_HEAD_BYTES = 64 * 1024
"""Request line plus headers; more is answered 431 (httptools alone would buffer them without end)."""
FD_RESERVE = 64
"""File descriptors kept out of the connection cap besides the upstream pool's: database, spool, logs, listener."""
LINGERING_MAX = 32
"""Connections closed after an error answer that may linger at once (`gateway._http`); outside the cap, so reserved."""
BODY_RATE_GRACE_S = 10.0
"""From the end of a request's head, the time its body has before its average pace counts (`min_body_rate`)."""
DEFAULT_MAX_CONNECTIONS = 4096
"""The cap when the file-descriptor limit allows more (one event loop serves this many comfortably)."""


def derived_max_connections(upstream_max_connections: int, fd_limit: int | None = None) -> int:
    """Client connections the fd limit leaves room for after the upstream pool, `FD_RESERVE` and lingering ones."""
    if fd_limit is None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        fd_limit = DEFAULT_MAX_CONNECTIONS * 2 if soft == resource.RLIM_INFINITY else soft
    room = fd_limit - upstream_max_connections - FD_RESERVE - LINGERING_MAX
    return max(16, min(DEFAULT_MAX_CONNECTIONS, room))


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The limits the gateway's server (`gateway._http`) enforces (defaults: `GatewaySettings`' ones)."""

    max_body_bytes: int
    head_timeout_s: float
    """From the connection's start or a request's first byte to the end of its headers: else 408."""
    body_timeout_s: float
    """Longest wait for the next bytes of a request body: else 408 (the call is not recorded)."""
    min_body_rate: int
    """Bytes per second a request body must average once `body_rate_grace_s` passed; 0: no minimum."""
    body_rate_grace_s: float
    keepalive_idle_s: float
    """An idle keep-alive connection is closed after this long (longer than client pools keep theirs)."""
    max_connections: int
    """Open client connections; beyond it the longest-waiting idle one is closed, or the new one refused (503)."""
    max_request_bytes_in_flight: int
    """Request-body bytes held by all connections at once; a request that would exceed it gets a 503."""

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ServerLimits:
        cap = settings.max_connections or derived_max_connections(settings.upstream_max_connections)
        return cls(
            max_body_bytes=settings.max_body_bytes,
            head_timeout_s=settings.head_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            min_body_rate=settings.min_body_rate,
            body_rate_grace_s=BODY_RATE_GRACE_S,
            keepalive_idle_s=settings.keepalive_idle_s,
            max_connections=cap,
            max_request_bytes_in_flight=settings.max_request_bytes_in_flight,
        )


class ByteBudget:
    """A count of bytes held against a limit, shared by every call of one process (one event loop)."""

    __slots__ = ("held", "limit", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0

    def take(self, size: int) -> bool:
        """Hold `size` more bytes if that stays within the limit."""
        held = self.held + size
        if held > self.limit:
            return False
        self.held = held
        if held > self.peak:
            self.peak = held
        return True

    def give_back(self, size: int) -> None:
        self.held -= size
