"""The hot path: forward a call upstream and record it (each request of the gateway's server outside `/_ledger/`).

    client ─► body (read by the server under the limits) ─► call.started ─► upstream ─► relay bytes as they come
                                                                                          │ SSE scanned on the side
                strict: final bytes wait for the final event ◄────────────────────────────┘ (body / the stream's end marker)

Bytes in = bytes out, but for the usage a stream did not ask for: asked upstream, taken back from what the
client gets (`gateway.observed`). This is the only path: the tests drive it through the real server on a
loopback port, as `ledger serve` runs it.
"""

from __future__ import annotations

import structlog

from usage_ledger.gateway._http import Exchange, Request, Upstream
from usage_ledger.gateway.call import AbortResponse, Call
from usage_ledger.gateway.errors import GatewayError
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.headers import parse_ledger_headers
from usage_ledger.gateway.limits import ByteBudget
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.paths import call_path
from usage_ledger.gateway.recorder import Recorder
from usage_ledger.gateway.settings import GatewaySettings

__all__ = ("Proxy",)

log = structlog.get_logger("gateway")


class Proxy:
    """The passthrough for every path outside `/_ledger/`: one `Call` per request."""

    def __init__(
        self,
        settings: GatewaySettings,
        upstream: Upstream,
        recorder: Recorder,
        metrics: Metrics,
        *,
        fingerprint_key: FingerprintKey | None = None,
    ) -> None:
        self.settings = settings
        self.fingerprint_key = fingerprint_key or FingerprintKey.generate()
        """Keys the fingerprints of recorded secrets (headers, query); in-memory random one if not given."""
        self.upstream = upstream
        self.recorder = recorder
        self.metrics = metrics
        self.stored_bytes = ByteBudget(settings.max_stored_bytes_in_flight)
        """Response bytes all calls keep for their blobs at once (`gateway.kept`)."""
        self.upstream_url = upstream.base_url
        self.upstream_forces_usage: bool | None = settings.upstream_forces_usage
        """Whether the upstream sends usage in every stream unasked; None until a stream shows it."""

    async def handle(self, request: Request, exchange: Exchange) -> None:
        """Serve one request from the server (its body is complete and within the limits)."""
        path = request.raw_path.decode("latin-1")
        try:
            ledger_tags, headers = parse_ledger_headers(request.headers)
            routed = call_path(request.method, path)  # refuses an ambiguous spelling of a call's path
        except GatewayError as exc:
            exchange.respond_json(exc.status, exc.body())
            return
        query = request.query.decode("latin-1")
        call = Call(self, request.method, path, routed, query, headers, request.body, request.received, ledger_tags)
        exchange.on_disconnect = call.disconnected
        self.metrics.in_flight += 1
        try:
            await call.run(exchange)
        except AbortResponse as exc:
            log.info("response_aborted", call_id=call.call_id, reason=str(exc))
            raise  # the server drops the connection: a cut body must not look complete
        finally:
            exchange.on_disconnect = None
            self.metrics.in_flight -= 1
