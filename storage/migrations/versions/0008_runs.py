"""Each run of a study is kept (`tuner_runs`): when it began and ended, its slots and budget, and the trials it
launched, so that the time its slots stood idle can be stated beside its trials' own (`tuner.storage.spend`).
Studies run before have no runs: their trials' time is all that is known of them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tuner_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("gpus_per_slot", sa.Integer(), nullable=False),
        sa.Column("trials", sa.JSON(), nullable=False),
        sa.Column("budget_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["tuner_studies.id"], name=op.f("fk_tuner_runs_study_id_tuner_studies"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_runs")),
    )
    op.create_index(op.f("ix_tuner_runs_study_id"), "tuner_runs", ["study_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_tuner_runs_study_id"), table_name="tuner_runs")
    op.drop_table("tuner_runs")
