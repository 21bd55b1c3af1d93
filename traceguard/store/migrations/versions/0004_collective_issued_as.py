"""collectives by type: the framework operations that issued each type's kernels

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("collective_types") as batch:
        batch.add_column(sa.Column("issued_as", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("collective_types") as batch:
        batch.drop_column("issued_as")
