"""Errors of the gateway, and their one HTTP mapping (OpenAI-shaped JSON bodies).

    GatewayError                 base; `status`, `kind` (OpenAI `type`), `code`, `param`
    ├── InvalidLedgerHeader      400  an X-Ledger-* header is malformed (names the header)
    ├── NonCanonicalPath         400  a POST path that may reach an inference API, spelled ambiguously
    ├── BodyTooLarge             413  the request body exceeds `max_body_bytes`
    ├── RequestTimeout           408  the request head or body did not arrive in time (`gateway.limits`)
    ├── GatewayBusy              503  at the connection cap, or the request-body budget is full
    ├── LedgerUnavailable        503  strict durability: the call's start is durable nowhere (Retry-After)
    └── UpstreamError            base of what went wrong talking to the upstream
        ├── UpstreamUnreachable  502  connection refused / DNS / connect failure
        ├── UpstreamTimeout      504  no answer (connect, headers or body) within the timeout
        └── UpstreamReset        502  the upstream closed the connection mid-response
            └── UpstreamInvalid  502  its response cannot be relayed (malformed; a status outside 100-599, or
                                      101 when no upgrade was asked): the client's connection closes after the 502

Upstream *responses* (any status) are never GatewayErrors: they pass through byte for byte.
"""

from __future__ import annotations

import msgspec

__all__ = (
    "BodyTooLarge",
    "GatewayBusy",
    "GatewayError",
    "InvalidLedgerHeader",
    "LedgerUnavailable",
    "NonCanonicalPath",
    "RequestTimeout",
    "UpstreamError",
    "UpstreamInvalid",
    "UpstreamReset",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "error_body",
)


class GatewayError(Exception):
    status = 502
    kind = "gateway_error"
    code = "gateway_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, kind=self.kind, code=self.code, param=self.param)


class InvalidLedgerHeader(GatewayError):
    status = 400
    kind = "invalid_request_error"
    code = "invalid_ledger_header"


class NonCanonicalPath(GatewayError):
    status = 400
    kind = "invalid_request_error"
    code = "non_canonical_path"


class BodyTooLarge(GatewayError):
    status = 413
    kind = "invalid_request_error"
    code = "request_too_large"


class RequestTimeout(GatewayError):
    status = 408
    kind = "invalid_request_error"
    code = "request_timeout"


class GatewayBusy(GatewayError):
    status = 503
    kind = "server_error"
    code = "gateway_busy"


class LedgerUnavailable(GatewayError):
    status = 503
    kind = "server_error"
    code = "ledger_unavailable"
    retry_after_s = 5


class UpstreamError(GatewayError):
    status = 502
    kind = "upstream_error"
    reason = "upstream_unreachable"


class UpstreamUnreachable(UpstreamError):
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    reason = "upstream_timeout"


class UpstreamReset(UpstreamError):
    code = "upstream_reset"
    reason = "upstream_reset"


class UpstreamInvalid(UpstreamReset):
    """Same code and reason as a reset (the upstream broke the exchange); also ends the client's connection."""


class _Info(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str


class _Error(msgspec.Struct):
    error: _Info


_encoder = msgspec.json.Encoder()


def error_body(message: str, *, kind: str, code: str, param: str | None = None) -> bytes:
    return _encoder.encode(_Error(_Info(message=message, type=kind, param=param, code=code)))
