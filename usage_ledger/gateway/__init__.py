"""The gateway: a byte-transparent, recording reverse proxy in front of an OpenAI-compatible server.

Imports `ledger` only, through its face. Entry points: `serve` (what `ledger serve` runs), `create_app` (the
gateway's ASGI app), `gateway_app` + `listening` (`ledger replay`'s in-process gateway).

A streamed call's path, accept to commit (the modules it crosses, in order: those py-spy saw in `ledger serve`
relaying streamed calls on SQLite, 2026-12-05, put in the order the code calls them):

    connections   uvicorn's httptools protocol with the gateway's limits (head, idle, the connection cap)
    app           admin paths to Litestar, the rest to the proxy
    proxy         the passthrough's ASGI handler: one `Call` per request
    call          one call: request → upstream → relay → record
      body          the request body under the limits: size, shared budget, a minimum rate (408 below it)
      headers       `X-Ledger-*` read and stripped, hop-by-hop dropped; secrets (their values never recorded)
      inspect       what the request is: a call or not, its model and sampling, its stream options
      upstream      the shared aiohttp client: the request sent, the response's head
      relay         how body bytes go to the client: as they come, the end held back for the record
      sse, usage    the SSE scanner; the tokens and usage per inference API
      kept          the response's bytes kept for its blob, within a per-call cap and a shared budget
      observed      what the response said, noted as it passes: token moments, usage, finish reasons
      response      the ASGI response to the client (aborted, not ended, when the upstream breaks)
      recorder      `call.started` / `call.finished` events, durable before the last byte in strict mode
      metrics, limits
    ledger        writer (group commit) → append → events, blobs, chunk_gaps, counts, _rows, chain, schema
                  → _thread + sqlite_append (or pg_append)

18 modules of the gateway and 11 of the ledger. The HTTP layers under `connections` and `upstream` are
uvicorn's and aiohttp's (issue #38: docs/BENCHMARKS.md, "The gateway's HTTP stack").
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
from usage_ledger.gateway.headers import MAX_HEADER_VALUE
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.secrets import is_secret_name
from usage_ledger.gateway.serve import Background, bind_socket, gateway_app, listening, serve
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.gateway.sse import SseEvent, SseScanner
from usage_ledger.gateway.upstream import Upstream, UpstreamResponse

__all__ = (
    "MAX_HEADER_VALUE",
    "Background",
    "BodyTooLarge",
    "GatewayApp",
    "GatewayError",
    "GatewaySettings",
    "InvalidLedgerHeader",
    "Metrics",
    "SseEvent",
    "SseScanner",
    "Upstream",
    "UpstreamError",
    "UpstreamReset",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "bind_socket",
    "create_app",
    "gateway_app",
    "is_secret_name",
    "listening",
    "serve",
)
