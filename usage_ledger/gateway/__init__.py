"""The gateway: a byte-transparent, recording reverse proxy in front of an OpenAI-compatible server.

Imports `ledger` only. Entry points: `serve` (what `ledger serve` runs), `create_app` (the gateway's ASGI app) and `commands.register`.
"""

from __future__ import annotations

from usage_ledger.gateway.app import GatewayApp, create_app
from usage_ledger.gateway.errors import (
    BodyTooLarge,
    GatewayError,
    InvalidLedgerHeader,
    UpstreamError,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from usage_ledger.gateway.serve import Background, serve
from usage_ledger.gateway.sse import SseEvent, SseScanner
from usage_ledger.gateway.upstream import Upstream, UpstreamResponse

__all__ = (
    "Background",
    "BodyTooLarge",
    "GatewayApp",
    "GatewayError",
    "InvalidLedgerHeader",
    "SseEvent",
    "SseScanner",
    "Upstream",
    "UpstreamError",
    "UpstreamReset",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "create_app",
    "serve",
)
