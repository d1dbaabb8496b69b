"""The ledger's own settings, and the convention every layer's settings follow.

Each layer declares what it reads as a frozen msgspec Struct of its own: `StorageSettings` and
`LogSettings` here, `gateway.settings.GatewaySettings`, `projections.settings.ReportSettings`,
`otel.settings.OtelSettings`. A field `x` is the environment variable `LEDGER_X`, and field names
are unique across layers. Nothing is read at import time: the composition root
(`usage_ledger.settings.load_settings`) reads the environment and flags once and hands each layer
its own part. Tests build the parts directly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from usage_ledger.ledger.db import ledger_file

__all__ = ("ENV_PREFIX", "LogSettings", "StorageSettings", "default_state_dir")

ENV_PREFIX = "LEDGER_"

SqliteSynchronous = Literal["full", "normal"]
LogFormat = Literal["auto", "json", "console"]


class StorageSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where the ledger lives and how it is written; signed checkpoints (docs/auditing.md)."""

    database_url: str = "sqlite:///./ledger.db"
    state_dir: str = ""
    """The gateway's own files: the outage spool (`spool/`), the fingerprint and spool keys beside it. Empty:
    `default_state_dir` (beside a SQLite ledger; per user for PostgreSQL)."""
    spool_dir: str = ""
    """The outage spool; empty: `<state_dir>/spool`."""
    batch_max_events: int = 2000
    sqlite_synchronous: SqliteSynchronous = "full"
    pg_lock_timeout_s: float = 2.0
    """PostgreSQL: how long an append waits for the chain's head another appender holds, then spools (0: no bound)."""
    pg_idle_in_transaction_timeout_s: float = 5.0
    """PostgreSQL: how long the server lets an append's transaction sit between statements before ending it (a
    gateway stopped while holding the head; a healthy append's transaction lasts milliseconds). 0: no bound."""
    # signed checkpoints: off while checkpoint_key is unset
    checkpoint_key: str | None = None
    checkpoint_dir: str = "./ledger-checkpoints"
    checkpoint_interval_s: float = 300.0
    checkpoint_origin: str | None = None

    def __post_init__(self) -> None:
        for name in ("pg_lock_timeout_s", "pg_idle_in_transaction_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"LEDGER_{name.upper()} must not be negative (0: no bound)")
        # derived once, here, so every reader sees the same concrete paths (the struct stays frozen)
        if not self.state_dir:
            msgspec.structs.force_setattr(self, "state_dir", str(default_state_dir(self.database_url)))
        if not self.spool_dir:
            msgspec.structs.force_setattr(self, "spool_dir", str(Path(self.state_dir) / "spool"))


def default_state_dir(database_url: str) -> Path:
    """Where a gateway keeps its files unless told: `<name>-state/` beside a SQLite ledger `<name>.db`; for
    any other ledger `$XDG_STATE_HOME/usage-ledger/<host>-<port>-<database>/` (`~/.local/state` by default).
    Computed only: nothing is created here."""
    try:
        url = make_url(database_url)
    except ArgumentError:
        url = None  # reported where the URL is opened
    if (file := ledger_file(database_url)) is not None:
        ledger = Path(file)
        return ledger.with_name(f"{ledger.stem}-state")
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    name = "-".join(str(part) for part in (url.host, url.port, url.database) if part) if url is not None else ""
    return base / "usage-ledger" / (name.replace("/", "_") or "default")


class LogSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    log_level: str = "info"
    log_format: LogFormat = "auto"
