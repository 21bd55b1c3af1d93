"""NCCL Inspector logs: one row per time window of a run's matched collectives (wait / transfer,
late rank, bus bandwidth on transfer time)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "inspector_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("window_start_s", sa.BigInteger(), nullable=False),
        sa.Column("window_s", sa.Integer(), nullable=False),
        sa.Column("instances", sa.BigInteger(), nullable=False),
        sa.Column("wait_ns", sa.BigInteger(), nullable=False),
        sa.Column("transfer_ns", sa.BigInteger(), nullable=False),
        sa.Column("nccl_wait_share", sa.Float(), nullable=True),
        sa.Column("late_rank", sa.Integer(), nullable=True),
        sa.Column("last_arrivals", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("busbw_transfer_median_gbps", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_inspector_windows_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inspector_windows")),
    )
    with op.batch_alter_table("inspector_windows", schema=None) as batch_op:
        batch_op.create_index("ix_inspector_windows_run_start", ["run_id", "window_start_s"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("inspector_windows", schema=None) as batch_op:
        batch_op.drop_index("ix_inspector_windows_run_start")
    op.drop_table("inspector_windows")
