"""The gateway: a byte-transparent, recording reverse proxy in front of an OpenAI-compatible server.

Imports `ledger` only. Entry points: `serve` (what `ledger serve` runs), `create_app` (the gateway
behind `gateway.server`) and `commands.register`.
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
from usage_ledger.gateway.rawclient import RawResponse, RawUpstream
from usage_ledger.gateway.serve import Background, serve
from usage_ledger.gateway.sse import SseEvent, SseScanner

__all__ = (
    "Background",
    "BodyTooLarge",
    "GatewayApp",
    "GatewayError",
    "InvalidLedgerHeader",
    "RawResponse",
    "RawUpstream",
    "SseEvent",
    "SseScanner",
    "UpstreamError",
    "UpstreamReset",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "create_app",
    "serve",
)
