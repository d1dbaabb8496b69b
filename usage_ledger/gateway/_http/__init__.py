"""The gateway's own HTTP/1.1 server and upstream client (private: `gateway.app`, `gateway.proxy`,
`gateway.call` and `gateway.serve` use this face only).

    HttpServer(handler, limits, metrics)   asyncio protocols + httptools; handler(Request, Exchange)
    Exchange                               the response, written straight to the client's transport
    run_asgi(app, request, exchange)       an ASGI app (the Litestar admin app) for one request
    Upstream / UpstreamResponse            the upstream client; `pipe` hands each body chunk to a sink
                                           from the upstream connection's protocol callback
    AbortSignal                            raised by a handler to drop the connection (no error log)

Why hand-written, not a maintained server and client (issue #38): uvicorn + aiohttp (and granian, httpx) were
behind by more than the 15 % the issue allows, measured side by side (docs/BENCHMARKS.md, "The gateway's HTTP
stack"). The difference is the design: what each upstream read brings is written to the client's transport from
the upstream connection's `data_received`, not by waking the call's task per chunk.
"""

from __future__ import annotations

from usage_ledger.gateway._http.asgi import run_asgi
from usage_ledger.gateway._http.client import KEEPALIVE_EXPIRY_S, Upstream, UpstreamResponse, tls_context
from usage_ledger.gateway._http.connection import AbortSignal
from usage_ledger.gateway._http.exchange import Exchange, Request
from usage_ledger.gateway._http.server import HttpServer

__all__ = (
    "KEEPALIVE_EXPIRY_S",
    "AbortSignal",
    "Exchange",
    "HttpServer",
    "Request",
    "Upstream",
    "UpstreamResponse",
    "run_asgi",
    "tls_context",
)
