"""Indexes on (run_id, rank) of the per-rank result tables: the links query comes in pages of
ranks (issue 30), each an indexed range, however many ranks the run has

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = (
    ("ix_rank_results_run_rank", "rank_results"),
    ("ix_collectives_run_rank", "collectives"),
    ("ix_peer_traffic_run_rank", "peer_traffic"),
    ("ix_connections_run_rank", "connections"),
)


def upgrade() -> None:
    for name, table in INDEXES:
        op.create_index(name, table, ["run_id", "rank"])


def downgrade() -> None:
    for name, table in reversed(INDEXES):
        op.drop_index(name, table_name=table)
