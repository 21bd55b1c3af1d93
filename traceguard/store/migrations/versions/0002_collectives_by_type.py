"""collectives by type per rank and step; the point-to-point rank × peer matrix

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "collective_types",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=True),
        sa.Column("collective", sa.String(length=50), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("time_ns", sa.BigInteger(), nullable=False),
        sa.Column("exposed_ns", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_collective_types_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collective_types")),
    )
    with op.batch_alter_table("collective_types", schema=None) as batch_op:
        batch_op.create_index("ix_collective_types_run_rank_index", ["run_id", "rank", "step_index"], unique=False)
        batch_op.create_index("ix_collective_types_run_collective", ["run_id", "collective"], unique=False)

    op.create_table(
        "peer_traffic",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("peer", sa.Integer(), nullable=False),
        sa.Column("kernels", sa.BigInteger(), nullable=False),
        sa.Column("time_ns", sa.BigInteger(), nullable=False),
        sa.Column("sends", sa.BigInteger(), nullable=True),
        sa.Column("recvs", sa.BigInteger(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.String(length=100), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_peer_traffic_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peer_traffic")),
    )
    with op.batch_alter_table("peer_traffic", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_peer_traffic_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("peer_traffic", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_peer_traffic_run_id"))
    op.drop_table("peer_traffic")
    with op.batch_alter_table("collective_types", schema=None) as batch_op:
        batch_op.drop_index("ix_collective_types_run_collective")
        batch_op.drop_index("ix_collective_types_run_rank_index")
    op.drop_table("collective_types")
