"""NCCL Inspector windows: the Inspector lines of each window's matched instances, so that a long
job's logs sent again as they grow replace a stored window only when they hold more of it

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inspector_windows", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lines", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inspector_windows", schema=None) as batch_op:
        batch_op.drop_column("lines")
