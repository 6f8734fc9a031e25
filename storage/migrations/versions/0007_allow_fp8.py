"""A study keeps whether its creator allowed FP8 weights and KV cache (`tuner study create --allow-fp8`): they
change the model's numerics, so a study searches them only when allowed. Studies stored before did not allow them
(an fp8 KV cache their space offered was searched then; their stored trials keep it).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
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
    # A plain ADD COLUMN, which SQLite runs in place: batch mode would copy tuner_studies to a new table and drop the
    # old one, and with foreign keys on, that drop deletes every trial of every study (ON DELETE CASCADE).
    op.add_column("tuner_studies", sa.Column("allow_fp8", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("allow_fp8")
