"""Load probes: a study's load policy (a search for the capacity, or one fixed load) and each trial's probes;
each request's queue time as the server reported it (vLLM's per-request metrics).

Studies and trials stored before have neither: they ran at a fixed load, and their one replay is their
measurement. Their requests have no queue time of their own (their queue figures came from vLLM's histogram).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_studies") as batch:
        batch.add_column(sa.Column("load", sa.JSON(), nullable=True))
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("probes", sa.JSON(), nullable=True))
    with op.batch_alter_table("tuner_requests") as batch:
        batch.add_column(sa.Column("queue_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_requests") as batch:
        batch.drop_column("queue_s")
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("probes")
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("load")
