"""The chain's head in a one-row table, `ledger_head` (last position and hash).

PostgreSQL appenders lock it and read the tail in one statement (`SELECT … FOR UPDATE`), instead of
an advisory lock and then `ORDER BY position DESC LIMIT 1`; both backends move it in the transaction
that appends. Filled here from the events already stored. Stop the gateways before upgrading: an
append by a gateway of the old version would not move it (the next append would then collide on
its position and fail, never fork the chain).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ledger_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_ledger_head_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_head")),
    )
    tail = (
        op.get_bind()
        .execute(sa.text("SELECT position, hash FROM ledger_events ORDER BY position DESC LIMIT 1"))
        .first()
    )
    position, hash_ = (int(tail[0]), str(tail[1])) if tail is not None else (0, "0" * 64)
    op.execute(
        sa.text("INSERT INTO ledger_head (id, position, hash) VALUES (1, :position, :hash)").bindparams(
            position=position, hash=hash_
        )
    )


def downgrade() -> None:
    op.drop_table("ledger_head")
