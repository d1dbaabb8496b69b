"""The ledger: an append-only, hash-chained event store with content-addressed bodies.

Imports nothing of gateway/ or projections/; they import it.
"""

from __future__ import annotations

from usage_ledger.ledger.append import AppendResult, AppendStream, append_events, appending
from usage_ledger.ledger.blobs import blob_hash, read_blob
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.errors import (
    BlobNotFound,
    ConfigError,
    DatabaseUnavailable,
    LedgerError,
    SchemaError,
    SpoolCorrupt,
)
from usage_ledger.ledger.migrate import require_head, upgrade_database
from usage_ledger.ledger.read import StoredEvent, follow_events, head_position, iter_events, read_events
from usage_ledger.ledger.settings import LogSettings, StorageSettings
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.verify import ChainReport, verify_chain
from usage_ledger.ledger.writer import EventWriter, replay_spool

__all__ = (
    "AppendResult",
    "AppendStream",
    "BlobNotFound",
    "ChainReport",
    "ConfigError",
    "Database",
    "DatabaseUnavailable",
    "EventWriter",
    "LedgerError",
    "LogSettings",
    "SchemaError",
    "Spool",
    "SpoolCorrupt",
    "StorageSettings",
    "StoredEvent",
    "append_events",
    "appending",
    "blob_hash",
    "follow_events",
    "head_position",
    "iter_events",
    "open_database",
    "read_blob",
    "read_events",
    "replay_spool",
    "require_head",
    "upgrade_database",
    "verify_chain",
)
