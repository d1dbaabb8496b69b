"""The gateway: a byte-transparent, recording reverse proxy in front of an OpenAI-compatible server.

Imports `ledger` only. Entry points: `create_app` (the ASGI app) and `commands.register` (`ledger serve`).
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
from usage_ledger.gateway.upstream import UpstreamClient, UpstreamResponse, httpx_client

__all__ = (
    "Background",
    "BodyTooLarge",
    "GatewayApp",
    "GatewayError",
    "InvalidLedgerHeader",
    "SseEvent",
    "SseScanner",
    "UpstreamClient",
    "UpstreamError",
    "UpstreamReset",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "create_app",
    "httpx_client",
    "serve",
)
