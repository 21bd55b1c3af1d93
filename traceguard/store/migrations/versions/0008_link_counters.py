"""link counters (nsys GPU metrics): each step's PCIe and NVLink load over its GPU span and its NCCL
kernels; each rank's load during its NCCL kernels and where NCCL's bytes went

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out (not imported from traceguard.report.fields): a migration stays what it was.
STEP_COLUMNS = (
    ("pcie_avg_pct", sa.Float()),
    ("pcie_peak_pct", sa.Float()),
    ("nvlink_avg_pct", sa.Float()),
    ("nvlink_peak_pct", sa.Float()),
    ("nccl_pcie_avg_pct", sa.Float()),
    ("nccl_nvlink_avg_pct", sa.Float()),
)
RANK_COLUMNS = (
    ("link_device", sa.Integer()),
    ("link_nccl_samples", sa.Integer()),
    ("pcie_nccl_avg", sa.Float()),
    ("pcie_nccl_p95", sa.Float()),
    ("pcie_nccl_peak", sa.Float()),
    ("nvlink_nccl_avg", sa.Float()),
    ("nvlink_nccl_p95", sa.Float()),
    ("nvlink_nccl_peak", sa.Float()),
    ("nccl_nvlink_share", sa.Float()),
    ("nccl_pcie_share", sa.Float()),
    ("nccl_link_idle_share", sa.Float()),
    ("link_nccl_ns", sa.BigInteger()),
    ("nccl_nvlink_ns", sa.BigInteger()),
    ("nccl_pcie_ns", sa.BigInteger()),
    ("nccl_link_idle_ns", sa.BigInteger()),
)
TABLES = (("steps", STEP_COLUMNS), ("rank_results", RANK_COLUMNS))


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
