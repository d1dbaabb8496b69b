"""The calls read model keeps each call's finish reason.

One nullable column of `projection_calls`, `finish_reason` (`stop`, `length`, `tool_calls`, …; the
Responses API's `incomplete_details.reason`), from `call.finished` (choice 0's) or an import's
optional field. The calls projection's checkpoints go back to 0, so the follower folds every event
again into the rows it has (whole-row upserts: the rows stay readable meanwhile) and fills it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("projection_calls") as batch:
        batch.add_column(sa.Column("finish_reason", sa.String(64), nullable=True))
    op.execute("UPDATE ledger_checkpoints SET position = 0 WHERE projection = 'calls'")


def downgrade() -> None:
    with op.batch_alter_table("projection_calls") as batch:
        batch.drop_column("finish_reason")
