"""tuner's tables: studies, traces, trials, their requests and launch failures.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tuner_studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=512), nullable=False),
        sa.Column("created_at", sa.String(length=64), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("model_info", sa.JSON(), nullable=False),
        sa.Column("trace_path", sa.Text(), nullable=False),
        sa.Column("trace_sha256", sa.String(length=64), nullable=False),
        sa.Column("trace_selection", sa.JSON(), nullable=False),
        sa.Column("boundary", sa.String(length=32), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("space_name", sa.String(length=256), nullable=False),
        sa.Column("space_text", sa.Text(), nullable=False),
        sa.Column("sampler", sa.String(length=64), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("request_timeout_s", sa.Float(), nullable=False),
        sa.Column("startup_timeout_s", sa.Float(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_studies")),
        sa.UniqueConstraint("name", name=op.f("uq_tuner_studies_name")),
    )
    op.create_table(
        "tuner_traces",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("format", sa.String(length=32), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("span_s", sa.Float(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("transformations", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_tuner_traces")),
    )
    op.create_table(
        "tuner_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("engine_config", sa.JSON(), nullable=False),
        sa.Column("serve_command", sa.Text(), nullable=False),
        sa.Column("measurement", sa.JSON(), nullable=True),
        sa.Column("failure_class", sa.String(length=32), nullable=True),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column("log_excerpt", sa.Text(), nullable=True),
        sa.Column("estimated_max_model_len", sa.Integer(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("timings", sa.JSON(), nullable=False),
        sa.Column("hardware", sa.JSON(), nullable=False),
        sa.Column("vllm_version", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.String(length=64), nullable=False),
        sa.Column("finished_at", sa.String(length=64), nullable=True),
        sa.Column("score", sa.JSON(), nullable=False),
        sa.Column("prune_reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["tuner_studies.id"],
                                name=op.f("fk_tuner_trials_study_id_tuner_studies"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_trials")),
        sa.UniqueConstraint("study_id", "trial_number", name=op.f("uq_tuner_trials_study_id_trial_number")),
    )
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
    op.create_table(
        "tuner_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("request_index", sa.Integer(), nullable=False),
        sa.Column("scheduled_s", sa.Float(), nullable=False),
        sa.Column("sent_s", sa.Float(), nullable=True),
        sa.Column("requested_tokens", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("e2e_s", sa.Float(), nullable=True),
        sa.Column("itl_mean_s", sa.Float(), nullable=True),
        sa.Column("itl_p95_s", sa.Float(), nullable=True),
        sa.Column("itl_max_s", sa.Float(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["trial_id"], ["tuner_trials.id"],
                                name=op.f("fk_tuner_requests_trial_id_tuner_trials"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_requests")),
    )
    op.create_index(op.f("ix_tuner_requests_trial_id"), "tuner_requests", ["trial_id"], unique=False)


def downgrade() -> None:
    for table in ("tuner_requests", "tuner_launch_failures", "tuner_trials", "tuner_traces", "tuner_studies"):
        op.drop_table(table)
