"""Projections: live-version pointers, the calls read model, run annotations.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from usage_ledger.ledger.schema import UTCDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "projection_versions",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("live_version", sa.Integer(), nullable=False),
        sa.Column("formula", sa.String(64), nullable=False),
        sa.Column("head_position", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("promoted_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_projection_versions")),
    )
    op.create_table(
        "projection_calls",
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(255), nullable=False),
        sa.Column("run", sa.String(255), nullable=True),
        sa.Column("ticker", sa.String(255), nullable=True),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("source", sa.String(512), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("failure_reason", sa.String(64), nullable=True),
        sa.Column("usage_source", sa.String(16), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("first_token_at", UTCDateTime(), nullable=True),
        sa.Column("last_token_at", UTCDateTime(), nullable=True),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("elapsed_s", sa.Float(), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=True),
        sa.Column("prefill_tps", sa.Float(), nullable=True),
        sa.Column("decode_tps", sa.Float(), nullable=True),
        sa.Column("request_blob", sa.String(64), nullable=True),
        sa.Column("response_blob", sa.String(64), nullable=True),
        sa.Column("retags", sa.Integer(), nullable=False),
        sa.Column("last_position", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("version", "call_id", name=op.f("pk_projection_calls")),
    )
    op.create_index(
        op.f("ix_projection_calls_version_run_started_at"), "projection_calls", ["version", "run", "started_at"]
    )
    op.create_index(op.f("ix_projection_calls_version_started_at"), "projection_calls", ["version", "started_at"])
    op.create_table(
        "projection_annotations",
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("run", sa.String(255), nullable=True),
        sa.Column("start_at", UTCDateTime(), nullable=True),
        sa.Column("end_at", UTCDateTime(), nullable=True),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("version", "position", name=op.f("pk_projection_annotations")),
    )


def downgrade() -> None:
    # The read models' checkpoints go with their rows: left behind, an upgrade would find the new,
    # empty tables "caught up" and never fill them.
    op.execute("DELETE FROM ledger_checkpoints WHERE projection IN ('calls', 'annotations')")
    op.drop_table("projection_annotations")
    op.drop_index(op.f("ix_projection_calls_version_started_at"), table_name="projection_calls")
    op.drop_index(op.f("ix_projection_calls_version_run_started_at"), table_name="projection_calls")
    op.drop_table("projection_calls")
    op.drop_table("projection_versions")
