"""who waits for whom: each step's wait / transfer split, GPU time broken down and lateness; each
rank's wait / transfer, last arrivals and clock alignment; collective bandwidth from transfer time

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_COLUMNS = (
    ("nccl_wait_ns", sa.BigInteger()),
    ("nccl_transfer_ns", sa.BigInteger()),
    ("period_ns", sa.BigInteger()),
    ("compute_ns", sa.BigInteger()),
    ("comm_ns", sa.BigInteger()),
    ("comm_wait_ns", sa.BigInteger()),
    ("comm_transfer_ns", sa.BigInteger()),
    ("copy_ns", sa.BigInteger()),
    ("idle_host_ns", sa.BigInteger()),
    ("idle_other_ns", sa.BigInteger()),
    ("lateness_ns", sa.Float()),
)
RANK_COLUMNS = (
    ("nccl_wait_ns", sa.BigInteger()),
    ("nccl_transfer_ns", sa.BigInteger()),
    ("nccl_wait_share", sa.Float()),
    ("last_arrivals", sa.Integer()),
    ("last_arrivals_of", sa.Integer()),
    ("median_late_ns", sa.Float()),
    ("is_late_rank", sa.Boolean()),
    ("clock_offset_ns", sa.BigInteger()),
    ("clock_residual_ns", sa.BigInteger()),
)
COLLECTIVE_COLUMNS = (
    ("transfer_median_ns", sa.Float()),
    ("matched", sa.BigInteger()),
    ("bandwidth_time", sa.String(length=10)),
)
TABLES = (("steps", STEP_COLUMNS), ("rank_results", RANK_COLUMNS), ("collectives", COLLECTIVE_COLUMNS))


def upgrade() -> None:
    for table, columns in TABLES:
        with op.batch_alter_table(table) as batch:
            for name, kind in columns:
                batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for table, columns in reversed(TABLES):
        with op.batch_alter_table(table) as batch:
            for name, _ in reversed(columns):
                batch.drop_column(name)
