"""Ledger core: events (append-only, hash-chained), blobs, projection checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from usage_ledger.ledger.schema import UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A blob row may change only by redaction: content removed, redacted_at set, identity kept.
_SQLITE_TRIGGERS = (
    """CREATE TRIGGER ledger_events_no_update BEFORE UPDATE ON ledger_events
       BEGIN SELECT RAISE(ABORT, 'ledger_events is append-only: UPDATE refused'); END""",
    """CREATE TRIGGER ledger_events_no_delete BEFORE DELETE ON ledger_events
       BEGIN SELECT RAISE(ABORT, 'ledger_events is append-only: DELETE refused'); END""",
    """CREATE TRIGGER ledger_blobs_no_delete BEFORE DELETE ON ledger_blobs
       BEGIN SELECT RAISE(ABORT, 'ledger_blobs: DELETE refused (use ledger redact)'); END""",
    """CREATE TRIGGER ledger_blobs_redaction_only BEFORE UPDATE ON ledger_blobs
       WHEN NOT (NEW.hash = OLD.hash AND NEW.size = OLD.size AND NEW.created_at = OLD.created_at
                 AND NEW.content IS NULL AND OLD.redacted_at IS NULL AND NEW.redacted_at IS NOT NULL)
       BEGIN SELECT RAISE(ABORT, 'ledger_blobs: only redaction may change a blob (use ledger redact)'); END""",
)

_PG_TRIGGERS = (
    """CREATE FUNCTION ledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP; END $$""",
    """CREATE FUNCTION ledger_blob_redaction_only() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         IF NEW.hash = OLD.hash AND NEW.size = OLD.size AND NEW.created_at = OLD.created_at
            AND NEW.content IS NULL AND OLD.redacted_at IS NULL AND NEW.redacted_at IS NOT NULL THEN
           RETURN NEW;
         END IF;
         RAISE EXCEPTION 'ledger_blobs: only redaction may change a blob (use ledger redact)';
       END $$""",
    """CREATE TRIGGER ledger_events_no_update_delete BEFORE UPDATE OR DELETE ON ledger_events
       FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change()""",
    """CREATE TRIGGER ledger_events_no_truncate BEFORE TRUNCATE ON ledger_events
       FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change()""",
    """CREATE TRIGGER ledger_blobs_no_delete BEFORE DELETE ON ledger_blobs
       FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change()""",
    """CREATE TRIGGER ledger_blobs_no_truncate BEFORE TRUNCATE ON ledger_blobs
       FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change()""",
    """CREATE TRIGGER ledger_blobs_redaction_only BEFORE UPDATE ON ledger_blobs
       FOR EACH ROW EXECUTE FUNCTION ledger_blob_redaction_only()""",
)


def upgrade() -> None:
    op.create_table(
        "ledger_events",
        sa.Column(
            "position", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=False, nullable=False
        ),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("stream", sa.String(255), nullable=False),
        sa.Column("occurred_at", UTCDateTime(), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("position", name=op.f("pk_ledger_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_ledger_events_event_id")),
    )
    op.create_index(op.f("ix_ledger_events_stream"), "ledger_events", ["stream"])
    op.create_index(op.f("ix_ledger_events_type"), "ledger_events", ["type"])
    op.create_table(
        "ledger_blobs",
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("codec", sa.String(16), nullable=False),
        sa.Column("stored_size", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("redacted_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_ledger_blobs")),
    )
    op.create_table(
        "ledger_checkpoints",
        sa.Column("projection", sa.String(100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("projection", "version", name=op.f("pk_ledger_checkpoints")),
    )
    triggers = _PG_TRIGGERS if op.get_bind().dialect.name == "postgresql" else _SQLITE_TRIGGERS
    for statement in triggers:
        op.execute(statement)


def downgrade() -> None:
    op.drop_table("ledger_checkpoints")
    op.drop_table("ledger_blobs")
    op.drop_index(op.f("ix_ledger_events_type"), table_name="ledger_events")
    op.drop_index(op.f("ix_ledger_events_stream"), table_name="ledger_events")
    op.drop_table("ledger_events")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS ledger_blob_redaction_only()")
        op.execute("DROP FUNCTION IF EXISTS ledger_refuse_change()")
