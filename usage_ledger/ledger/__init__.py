"""The ledger: an append-only, hash-chained event store with content-addressed bodies.

Imports nothing of gateway/ or projections/; they import it.
"""

from __future__ import annotations

from usage_ledger.ledger.append import (
    AppendResult,
    AppendStream,
    append_events,
    appending,
    as_ledger_errors,
    translate_db_error,
)
from usage_ledger.ledger.backend import Checkpoint
from usage_ledger.ledger.blobs import (
    Erasure,
    blob_erasures,
    blob_hash,
    blob_redacted_at,
    blob_stream,
    read_blob,
    redact_blob,
)
from usage_ledger.ledger.checkpoint import (
    generate_key,
    load_signing_key,
    load_verifier_key,
    sign_checkpoint,
    write_key_files,
)
from usage_ledger.ledger.checkpointer import Checkpointer, read_checkpoint_notes, write_checkpoint_file
from usage_ledger.ledger.chunk_gaps import decode_chunk_gaps, encode_chunk_gaps
from usage_ledger.ledger.counts import count_problem, plausible_count, usage_problem
from usage_ledger.ledger.db import Database, backend_of, ledger_file, open_database
from usage_ledger.ledger.durable import check_owned, fsync_dir
from usage_ledger.ledger.erasure import ERASE_BATCH, ErasedBatch, erase_bodies, reclaim_space
from usage_ledger.ledger.errors import (
    BlobNotFound,
    ConfigError,
    DatabaseUnavailable,
    LedgerError,
    SchemaError,
    SpoolCorrupt,
)
from usage_ledger.ledger.events import (
    BlobRedacted,
    CallFailed,
    CallFinished,
    CallImported,
    CallRetagged,
    CallStarted,
    Event,
    LabelsRecorded,
    NewEvent,
    ProjectionPromoted,
    RecordedLabel,
    RecordedReturn,
    ReturnsRecorded,
    RunAnnotated,
    SampleTrigger,
    Sampling,
    ServedModel,
    ServerSampled,
    Timings,
    Usage,
    UsageSource,
    call_stream,
    decode_event,
    new_event,
    utc_now,
)
from usage_ledger.ledger.guesses import DoorShut, GuessLimiter
from usage_ledger.ledger.heap import freeze_startup_heap
from usage_ledger.ledger.key_files import check_random, read_key_file
from usage_ledger.ledger.log import configure_logging
from usage_ledger.ledger.migrate import (
    current_revision,
    database_exists,
    downgrade_database,
    downgrade_steps,
    head_revision,
    require_head,
    revision_history,
    upgrade_database,
)
from usage_ledger.ledger.read import StoredEvent, follow_events, head_position, iter_events, read_events, read_stream
from usage_ledger.ledger.settings import ENV_PREFIX, LogSettings, StorageSettings
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.verify import CLOCK_SKEW, ChainReport, require_head_in_step, snapshot, verify_chain
from usage_ledger.ledger.verify_ledger import LedgerReport, chain_head, verify_ledger
from usage_ledger.ledger.version import VERSION
from usage_ledger.ledger.waiting import wait_up_to
from usage_ledger.ledger.writer import Durable, EventWriter, replay_spool

__all__ = (
    "CLOCK_SKEW",
    "ENV_PREFIX",
    "ERASE_BATCH",
    "VERSION",
    "AppendResult",
    "AppendStream",
    "BlobNotFound",
    "BlobRedacted",
    "CallFailed",
    "CallFinished",
    "CallImported",
    "CallRetagged",
    "CallStarted",
    "ChainReport",
    "Checkpoint",
    "Checkpointer",
    "ConfigError",
    "Database",
    "DatabaseUnavailable",
    "DoorShut",
    "Durable",
    "ErasedBatch",
    "Erasure",
    "Event",
    "EventWriter",
    "GuessLimiter",
    "LabelsRecorded",
    "LedgerError",
    "LedgerReport",
    "LogSettings",
    "NewEvent",
    "ProjectionPromoted",
    "RecordedLabel",
    "RecordedReturn",
    "ReturnsRecorded",
    "RunAnnotated",
    "SampleTrigger",
    "Sampling",
    "SchemaError",
    "ServedModel",
    "ServerSampled",
    "Spool",
    "SpoolCorrupt",
    "StorageSettings",
    "StoredEvent",
    "Timings",
    "Usage",
    "UsageSource",
    "append_events",
    "appending",
    "as_ledger_errors",
    "backend_of",
    "blob_erasures",
    "blob_hash",
    "blob_redacted_at",
    "blob_stream",
    "call_stream",
    "chain_head",
    "check_owned",
    "check_random",
    "configure_logging",
    "count_problem",
    "current_revision",
    "database_exists",
    "decode_chunk_gaps",
    "decode_event",
    "downgrade_database",
    "downgrade_steps",
    "encode_chunk_gaps",
    "erase_bodies",
    "follow_events",
    "freeze_startup_heap",
    "fsync_dir",
    "generate_key",
    "head_position",
    "head_revision",
    "iter_events",
    "ledger_file",
    "load_signing_key",
    "load_verifier_key",
    "new_event",
    "open_database",
    "plausible_count",
    "read_blob",
    "read_checkpoint_notes",
    "read_events",
    "read_key_file",
    "read_stream",
    "reclaim_space",
    "redact_blob",
    "replay_spool",
    "require_head",
    "require_head_in_step",
    "revision_history",
    "sign_checkpoint",
    "snapshot",
    "translate_db_error",
    "upgrade_database",
    "usage_problem",
    "utc_now",
    "verify_chain",
    "verify_ledger",
    "wait_up_to",
    "write_checkpoint_file",
    "write_key_files",
)
