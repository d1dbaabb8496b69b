"""The calls read model keeps vLLM's per-request speculative-decoding counters.

Three nullable columns of `projection_calls` (`spec_draft_tokens`, `spec_accepted_tokens`,
`spec_steps`), from each `call.finished`'s `request_metrics.speculative_decoding`. Rows written
before this revision have them NULL until `ledger projections rebuild` reads the events again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("spec_draft_tokens", "spec_accepted_tokens", "spec_steps")


def upgrade() -> None:
    with op.batch_alter_table("projection_calls") as batch:
        for name in _COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("projection_calls") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
