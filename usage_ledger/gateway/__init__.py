"""The gateway: a byte-transparent, recording reverse proxy in front of an OpenAI-compatible server.

Imports `ledger` only, through its face. Entry points: `serve` (what `ledger serve` runs), `create_app` (the
gateway's app, served by `gateway._http`), `gateway_app` + `listening` (`ledger replay`'s in-process gateway).

A streamed call's path, accept to commit (the modules it crosses, in order: those py-spy saw in `ledger serve`
relaying streamed calls on SQLite, 2026-12-05, put in the order the code calls them):

    _http         the gateway's own HTTP/1.1 server (connections under the limits: head, body size, pace and
                  budget, idle, the connection cap) and upstream client (why its own: its docstring)
    app           admin paths to Litestar, the rest to the proxy
    proxy         the passthrough's handler: one `Call` per request
    call          one call: request → upstream → relay → record
      headers       `X-Ledger-*` read and stripped, hop-by-hop dropped; secrets (their values never recorded)
      paths         whether the request is a call, by the path the upstream routes (ambiguous spellings: 400)
      inspect       what a call's body says: its model and sampling, its stream options
      relay         how body bytes go to the client: as they come (from the upstream connection's
                    callback straight to the client's transport), the end held back for the record
      sse, usage    the SSE scanner; the tokens and usage per inference API
      kept          the response's bytes kept for its blob, within a per-call cap and a shared budget
      observed      what the response said, noted as it passes: token moments, usage, finish reasons
      call_record   what the call tells the ledger and the operator: its events, usage, log line, metrics
      recorder      `call.started` / `call.finished` events, durable before the last byte in strict mode
      metrics, limits
    ledger        writer (group commit) → append → events, blobs, chunk_gaps, counts, _rows, chain, schema
                  → _thread + sqlite_append (or pg_append)
"""

from __future__ import annotations

from usage_ledger.gateway._http import Upstream, UpstreamResponse
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
from usage_ledger.gateway.paths import call_path
from usage_ledger.gateway.retention import EraseOlder, RetentionPass
from usage_ledger.gateway.secrets import is_secret_name
from usage_ledger.gateway.serve import Background, bind_socket, gateway_app, listening, serve, serve_asgi
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.gateway.sse import SseEvent, SseScanner

__all__ = (
    "MAX_HEADER_VALUE",
    "Background",
    "BodyTooLarge",
    "EraseOlder",
    "GatewayApp",
    "GatewayError",
    "GatewaySettings",
    "InvalidLedgerHeader",
    "Metrics",
    "RetentionPass",
    "SseEvent",
    "SseScanner",
    "Upstream",
    "UpstreamError",
    "UpstreamReset",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "bind_socket",
    "call_path",
    "create_app",
    "gateway_app",
    "is_secret_name",
    "listening",
    "serve",
    "serve_asgi",
)
