"""The schedules' runs and their morning summaries (tuner_schedule_runs).

Before this revision tuner.schedules created the table by hand, so a database at 0001 may have it already, rows
and all: it is kept as it is.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
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
    # IF NOT EXISTS rather than a look at the database: it also holds in an offline (`--sql`) script.
    op.create_table(
        "tuner_schedule_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule", sa.String(length=191), nullable=False),
        sa.Column("study", sa.String(length=512), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("due_at", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.String(length=64), nullable=False),
        sa.Column("window_end", sa.String(length=64), nullable=False),
        sa.Column("finished_at", sa.String(length=64), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_schedule_runs")),
        if_not_exists=True,
    )
    # The hand-made table's index had this name already (SQLAlchemy's default is the convention's).
    op.create_index(op.f("ix_tuner_schedule_runs_schedule"), "tuner_schedule_runs", ["schedule"], unique=False,
                    if_not_exists=True)
    if op.get_context().dialect.name == "postgresql":
        # A hand-made table's primary key has PostgreSQL's default name; renaming its index renames the
        # constraint, so that later migrations find it by the convention's name. (SQLite's was unnamed.)
        op.execute("ALTER INDEX IF EXISTS tuner_schedule_runs_pkey RENAME TO pk_tuner_schedule_runs")


def downgrade() -> None:
    op.drop_index(op.f("ix_tuner_schedule_runs_schedule"), table_name="tuner_schedule_runs")
    op.drop_table("tuner_schedule_runs")
