"""The ledger's own settings, and the convention every layer's settings follow.

Each layer declares what it reads as a frozen msgspec Struct of its own: `StorageSettings` and
`LogSettings` here, `gateway.settings.GatewaySettings`, `projections.settings.ReportSettings`,
`otel.settings.OtelSettings`. A field `x` is the environment variable `LEDGER_X`, and field names
are unique across layers. Nothing is read at import time: the composition root
(`usage_ledger.settings.load_settings`) reads the environment and flags once and hands each layer
its own part. Tests build the parts directly.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ("ENV_PREFIX", "LogSettings", "StorageSettings")

ENV_PREFIX = "LEDGER_"

SqliteSynchronous = Literal["full", "normal"]
LogFormat = Literal["auto", "json", "console"]


class StorageSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where the ledger lives and how it is written; signed checkpoints (docs/auditing.md)."""

    database_url: str = "sqlite:///./ledger.db"
    spool_dir: str = "./ledger-spool"
    batch_max_events: int = 2000
    sqlite_synchronous: SqliteSynchronous = "full"
    # signed checkpoints: off while checkpoint_key is unset
    checkpoint_key: str | None = None
    checkpoint_dir: str = "./ledger-checkpoints"
    checkpoint_interval_s: float = 300.0
    checkpoint_origin: str | None = None


class LogSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    log_level: str = "info"
    log_format: LogFormat = "auto"
