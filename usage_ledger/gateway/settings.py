"""The gateway's settings (`LEDGER_<FIELD>`; see `ledger.settings` for the convention, docs/configuration.md)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = ("Durability", "GatewaySettings")

Durability = Literal["strict", "async"]
_Positive = Annotated[float, msgspec.Meta(gt=0)]


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    upstream: str = "http://127.0.0.1:8200"
    host: str = "127.0.0.1"
    port: int = 8300
    durability: Durability = "strict"
    admin_token: str | None = None
    """Bearer token of the admin API, the read API and the dashboard mounted beside it; unset: open.
    Set but empty (or blank) is refused: it reads like a guard and would leave everything open."""
    max_body_bytes: int = 32 * 1024 * 1024
    upstream_connect_timeout_s: float = 10.0
    upstream_read_timeout_s: float = 600.0
    upstream_max_connections: int = 256
    upstream_ca_file: str | None = None
    """PEM file of the CA certificates an `https://` upstream is verified against; unset: the system's."""
    upstream_forces_usage: bool | None = None
    """The upstream sends usage in every stream unasked (vLLM --enable-force-include-usage); unset: detected."""
    # slow and large traffic (gateway.limits)
    head_timeout_s: _Positive = 30.0
    body_timeout_s: _Positive = 60.0
    min_body_rate: Annotated[int, msgspec.Meta(ge=0)] = 500
    """Bytes per second a request body must average after its first 10 s (else 408); 0: no minimum."""
    keepalive_idle_s: _Positive = 75.0
    max_connections: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Open client connections; unset: derived from the file-descriptor limit."""
    max_request_bytes_in_flight: Annotated[int, msgspec.Meta(ge=0)] = 128 * 1024 * 1024
    max_stored_body_bytes: Annotated[int, msgspec.Meta(ge=0)] = 16 * 1024 * 1024
    max_stored_bytes_in_flight: Annotated[int, msgspec.Meta(ge=0)] = 128 * 1024 * 1024
    fingerprint_key_file: str | None = None
    """The key of secret fingerprints (outside the database); unset: `ledger-fingerprint.key` in the state directory."""
    # sampling the upstream's /metrics (gateway.sampler, docs/server.md): 0 = off
    server_sample_s: float = 10.0
    server_sample_timeout_s: float = 5.0
    # retention (gateway.retention, docs/operations.md): unset = bodies are kept
    keep_bodies_days: _Positive | None = None
    """Erase the bodies of calls started more than this many days ago (`ledger serve --keep-bodies`)."""
    keep_bodies_interval_s: _Positive = 3600.0
    """How often the erasure runs (its first pass at start)."""

    def __post_init__(self) -> None:
        if self.admin_token is not None and not self.admin_token.strip():
            raise ValueError(
                "LEDGER_ADMIN_TOKEN is set but empty: set a token, or unset the variable to leave the admin API, "
                "metrics and dashboard open"
            )
