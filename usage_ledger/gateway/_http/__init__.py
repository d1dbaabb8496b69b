"""The gateway's own HTTP/1.1 server and upstream client (private: `gateway.app`, `gateway.proxy`,
`gateway.call` and `gateway.serve` use this face only).

    HttpServer(handler, limits, metrics)   asyncio protocols + httptools; handler(Request, Exchange)
    Exchange                               the response, written straight to the client's transport
    run_asgi(app, request, exchange)       an ASGI app (the Litestar admin app) for one request
    Upstream / UpstreamResponse            the upstream client; `pipe` hands each body chunk to a sink
                                           from the upstream connection's protocol callback
    AbortSignal                            raised by a handler to drop the connection (no error log)

Why hand-written, not a maintained server and client (issue #38): measured side by side against
uvicorn (httptools) + aiohttp, the gateway's ASGI app on them, by `bench/stacks.py` (`bench/gateway.py`
on the emulator and on real vLLM, `bench/saturated.py`; docs/BENCHMARKS.md, "The gateway's HTTP
stack", 2026-12-06), uvicorn + aiohttp were behind by more than the 15 % the issue allows: added
latency +31 % on the emulator and +20 % on real vLLM, added TTFT +130 % and +50 %, gateway CPU per
relayed chunk +64 %; and at 0.65 of the direct chunk rate against this code's 0.89 with a
CPU-saturated upstream. Granian cost more CPU per chunk than uvicorn (2026-12-05), httpx more than
aiohttp. The difference is the design, not a tunable: here what each upstream read brings is written
to the client's transport from the upstream connection's `data_received`, where an awaiting client
under an ASGI server wakes the call's task per chunk and crosses the server's `send`.
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
