"""Drop tuner_launch_failures: each of its rows repeated five columns of its trial's row in tuner_trials
(failure class, message, exit code, log excerpt, estimated max_model_len), and nothing read it.

A downgrade rebuilds it from tuner_trials, so no failure is lost either way.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("tuner_launch_failures")


def downgrade() -> None:
    op.create_table(
        "tuner_launch_failures",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("failure_class", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("log_excerpt", sa.Text(), nullable=False),
        sa.Column("estimated_max_model_len", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["trial_id"], ["tuner_trials.id"],
                                name=op.f("fk_tuner_launch_failures_trial_id_tuner_trials"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_launch_failures")),
        sa.UniqueConstraint("trial_id", name=op.f("uq_tuner_launch_failures_trial_id")),
    )
    # What tuner wrote there: every trial with a failure class, but proposals refused before launch.
    op.execute("INSERT INTO tuner_launch_failures (trial_id, failure_class, message, exit_code, log_excerpt, "
               "estimated_max_model_len) SELECT id, failure_class, COALESCE(failure_message, ''), exit_code, "
               "COALESCE(log_excerpt, ''), estimated_max_model_len FROM tuner_trials "
               "WHERE failure_class IS NOT NULL AND state <> 'infeasible'")
