"""The ledger: an append-only, hash-chained event store with content-addressed bodies.

Imports nothing of gateway/ or projections/; they import it.
"""

from __future__ import annotations

from ledger.append import AppendResult, append_events
from ledger.blobs import blob_hash, read_blob
from ledger.db import Database, open_database
from ledger.errors import BlobNotFound, ConfigError, DatabaseUnavailable, LedgerError, SchemaError, SpoolCorrupt
from ledger.migrate import require_head, upgrade_database
from ledger.read import StoredEvent, follow_events, head_position, iter_events, read_events
from ledger.settings import Settings, load_settings
from ledger.spool import Spool
from ledger.verify import ChainReport, verify_chain
from ledger.writer import EventWriter, replay_spool

__all__ = (
    "AppendResult",
    "BlobNotFound",
    "ChainReport",
    "ConfigError",
    "Database",
    "DatabaseUnavailable",
    "EventWriter",
    "LedgerError",
    "SchemaError",
    "Settings",
    "Spool",
    "SpoolCorrupt",
    "StoredEvent",
    "append_events",
    "blob_hash",
    "follow_events",
    "head_position",
    "iter_events",
    "load_settings",
    "open_database",
    "read_blob",
    "read_events",
    "replay_spool",
    "require_head",
    "upgrade_database",
    "verify_chain",
)
