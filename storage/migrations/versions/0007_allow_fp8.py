"""A study keeps whether its creator allowed FP8 weights and KV cache (`tuner study create --allow-fp8`): they
change the model's numerics, so a study searches them only when allowed. A study stored before whose space offered
an fp8 KV cache (a derived space on a GPU did) searched it: it is marked as allowing FP8, so that it goes on as it
began; every other study does not.

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
    studies = sa.table("tuner_studies", sa.column("allow_fp8", sa.Boolean()), sa.column("space_text", sa.Text()))
    op.execute(studies.update().where(studies.c.space_text.like("%fp8%")).values(allow_fp8=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("allow_fp8")
