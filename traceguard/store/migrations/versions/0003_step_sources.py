"""step sources: each rank's step source; the run's own step patterns

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("step_patterns", JSON, nullable=False, server_default=sa.text("'[]'")))
    with op.batch_alter_table("rank_results") as batch:
        batch.add_column(sa.Column("step_source", sa.String(length=20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rank_results") as batch:
        batch.drop_column("step_source")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("step_patterns")
