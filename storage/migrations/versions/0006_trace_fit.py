"""A trial keeps how its trace was fitted to its engine's context (`tuner.traces.records.TraceFit`): how many of
the trace's requests were clipped or scaled to its max_model_len. Trials stored before, and trials of a study
that replays lengths as recorded, have none.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("trace_fit", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("trace_fit")
