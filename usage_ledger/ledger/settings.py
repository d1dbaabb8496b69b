"""One `Settings` object, read from `LEDGER_*` environment variables and overridden by flags.

Nothing is read at import time: entry points call `load_settings(os.environ, overrides)` and pass
the result down. Tests build `Settings(...)` directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from usage_ledger.ledger.errors import ConfigError

__all__ = ("ENV_PREFIX", "Settings", "load_settings")

ENV_PREFIX = "LEDGER_"

Durability = Literal["strict", "async"]
SqliteSynchronous = Literal["full", "normal"]
LogFormat = Literal["auto", "json", "console"]
_Positive = Annotated[float, msgspec.Meta(gt=0)]


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every setting of usage-ledger; the env var is `LEDGER_<FIELD NAME IN CAPITALS>`."""

    # storage
    database_url: str = "sqlite:///./ledger.db"
    spool_dir: str = "./ledger-spool"
    batch_max_events: int = 2000
    sqlite_synchronous: SqliteSynchronous = "full"
    # gateway
    upstream: str = "http://127.0.0.1:8200"
    host: str = "127.0.0.1"
    port: int = 8300
    durability: Durability = "strict"
    admin_token: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    upstream_connect_timeout_s: float = 10.0
    upstream_read_timeout_s: float = 600.0
    upstream_max_connections: int = 256
    upstream_ca_file: str | None = None
    """PEM file of the CA certificates an `https://` upstream is verified against; unset: the system's."""
    upstream_forces_usage: bool | None = None
    """The upstream sends usage in every stream unasked (vLLM --enable-force-include-usage); unset: detected."""
    # slow and large traffic (gateway.limits, docs/configuration.md)
    head_timeout_s: _Positive = 30.0
    body_timeout_s: _Positive = 60.0
    keepalive_idle_s: _Positive = 75.0
    max_connections: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Open client connections; unset: derived from the file-descriptor limit."""
    max_request_bytes_in_flight: Annotated[int, msgspec.Meta(ge=0)] = 128 * 1024 * 1024
    max_stored_body_bytes: Annotated[int, msgspec.Meta(ge=0)] = 16 * 1024 * 1024
    max_stored_bytes_in_flight: Annotated[int, msgspec.Meta(ge=0)] = 128 * 1024 * 1024
    fingerprint_key_file: str | None = None
    """The key of secret fingerprints (outside the database); unset: `ledger-fingerprint.key` beside the spool dir."""
    # signed checkpoints (docs/auditing.md): off while checkpoint_key is unset
    checkpoint_key: str | None = None
    checkpoint_dir: str = "./ledger-checkpoints"
    checkpoint_interval_s: float = 300.0
    checkpoint_origin: str | None = None
    # sampling the upstream's /metrics (gateway.sampler, docs/server.md): 0 = off
    server_sample_s: float = 10.0
    server_sample_timeout_s: float = 5.0
    # `ledger serve` also runs `ledger otel export --follow` (docs/otel.md); the OTEL_* variables configure it
    otel_export: bool = False
    # projections and reports
    run_gap_s: float = 900.0
    tz: str = "UTC"
    # logging
    log_level: str = "info"
    log_format: LogFormat = "auto"


_FIELDS = frozenset(Settings.__struct_fields__)


def load_settings(env: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build settings from `LEDGER_*` variables in `env`, then `overrides` (flags; None = not given).

    Unknown `LEDGER_*` names fail fast so a typo never silently falls back to a default.
    """
    raw: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name.startswith("LEDGER_TEST_"):
            continue
        field = name[len(ENV_PREFIX) :].lower()
        if field not in _FIELDS:
            known = ", ".join(sorted(ENV_PREFIX + f.upper() for f in _FIELDS))
            raise ConfigError(f"unknown environment variable {name}; known settings are: {known}")
        raw[field] = value
    for field, value in (overrides or {}).items():
        if value is not None:
            raw[field] = value
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid setting: {exc} (check the LEDGER_* variable or flag)") from exc
