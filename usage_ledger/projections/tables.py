"""The projection tables, on a `MetaData` of their own (the ledger never imports projections).

Versioning: every read-model row carries the `version` it belongs to. A rebuild writes a new
version beside the live one; `projection_versions` holds the live pointer per projection, and
promotion switches it in one transaction. Checkpoints live in the ledger's `ledger_checkpoints`
(projection, version), written in the same transaction as the rows.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, Integer, MetaData, String, Table, Text

from usage_ledger.ledger.schema import NAMING_CONVENTION, UTCDateTime

__all__ = ("annotations_table", "calls", "metadata", "versions")

metadata = MetaData(naming_convention=NAMING_CONVENTION)

versions = Table(
    "projection_versions",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("live_version", Integer(), nullable=False),
    Column("formula", String(64), nullable=False),
    Column("head_position", BigInteger(), nullable=False),
    Column("digest", String(64), nullable=False),
    Column("promoted_at", UTCDateTime(), nullable=False),
)

calls = Table(
    "projection_calls",
    metadata,
    Column("version", Integer(), primary_key=True),
    Column("call_id", String(255), primary_key=True),
    Column("run", String(255), nullable=True),
    Column("ticker", String(255), nullable=True),
    Column("tags", Text(), nullable=False),
    Column("model", String(255), nullable=True),
    Column("origin", String(16), nullable=False),
    Column("source", String(512), nullable=True),
    Column("status", String(16), nullable=False),
    Column("http_status", Integer(), nullable=True),
    Column("failure_reason", String(64), nullable=True),
    Column("usage_source", String(16), nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("first_token_at", UTCDateTime(), nullable=True),
    Column("last_token_at", UTCDateTime(), nullable=True),
    Column("ended_at", UTCDateTime(), nullable=True),
    Column("elapsed_s", Float(), nullable=True),
    Column("ttft_s", Float(), nullable=True),
    Column("input_tokens", BigInteger(), nullable=False),
    Column("output_tokens", BigInteger(), nullable=False),
    Column("cached_tokens", BigInteger(), nullable=True),
    # vLLM's per-request speculative-decoding counters (`call_rules.spec_decode_counts`); all or none
    Column("spec_draft_tokens", BigInteger(), nullable=True),
    Column("spec_accepted_tokens", BigInteger(), nullable=True),
    Column("spec_steps", BigInteger(), nullable=True),
    Column("prefill_tps", Float(), nullable=True),
    Column("decode_tps", Float(), nullable=True),
    Column("request_blob", String(64), nullable=True),
    Column("response_blob", String(64), nullable=True),
    Column("retags", Integer(), nullable=False),
    Column("last_position", BigInteger(), nullable=False),
    # choice 0's (`call_fold._finish_reason`); `call_rules.TRUNCATED_REASONS` say the answer was cut
    Column("finish_reason", String(64), nullable=True),
    Index(None, "version", "run", "started_at"),
    Index(None, "version", "started_at"),
)

annotations_table = Table(
    "projection_annotations",
    metadata,
    Column("version", Integer(), primary_key=True),
    Column("position", BigInteger(), primary_key=True),
    Column("run", String(255), nullable=True),
    Column("start_at", UTCDateTime(), nullable=True),
    Column("end_at", UTCDateTime(), nullable=True),
    Column("labels", Text(), nullable=False),
)
