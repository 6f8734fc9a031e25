"""tuner's own tables, beside Optuna's in the same database: every name starts with `tuner_`."""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, MetaData, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

TABLE_PREFIX = "tuner_"
# Optuna keeps its own Alembic revision in `alembic_version`; ours must never overwrite it.
VERSION_TABLE = "tuner_alembic_version"

# Fixed constraint names, so that later migrations can address them on SQLite and PostgreSQL alike.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# The schedules: APScheduler's job store creates and keeps this table itself, outside the migrations.
SCHEDULE_JOBS_TABLE = "tuner_schedules"


def include_name(name: str | None, type_: str, parent_names: dict) -> bool:
    """Alembic filter: only the tables of tuner's migrations are compared or migrated, never Optuna's nor
    APScheduler's job store."""
    return type_ != "table" or ((name or "").startswith(TABLE_PREFIX) and name != SCHEDULE_JOBS_TABLE)


class Base(DeclarativeBase):
    """The declarative base of tuner's tables: their metadata names constraints by NAMING_CONVENTION."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StudyRow(Base):
    """One study's settings (a StudySettings' `to_dict`), unique by name; its trials go when it is deleted."""

    __tablename__ = "tuner_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(512), unique=True)
    created_at: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(Text)
    model_info: Mapped[dict] = mapped_column(JSON)
    trace_path: Mapped[str] = mapped_column(Text)
    trace_sha256: Mapped[str] = mapped_column(String(64))
    trace_selection: Mapped[dict] = mapped_column(JSON)
    boundary: Mapped[str] = mapped_column(String(32))
    limits: Mapped[dict] = mapped_column(JSON)
    space_name: Mapped[str] = mapped_column(String(256))
    space_text: Mapped[str] = mapped_column(Text)
    sampler: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int | None] = mapped_column(Integer)
    request_timeout_s: Mapped[float] = mapped_column(Float)
    startup_timeout_s: Mapped[float] = mapped_column(Float)
    extra: Mapped[dict] = mapped_column(JSON)
    load: Mapped[dict | None] = mapped_column(JSON)  # empty for a study created before load searches: fixed
    allow_fp8: Mapped[bool] = mapped_column(Boolean, server_default=false())  # FP8 weights and KV cache searched


class TraceRow(Base):
    """A trace's summary, keyed by the sha256 of its content: stored once, however many studies replay it."""

    __tablename__ = "tuner_traces"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    source: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(32))
    requests: Mapped[int] = mapped_column(Integer)
    span_s: Mapped[float] = mapped_column(Float)
    stats: Mapped[dict] = mapped_column(JSON)
    transformations: Mapped[list] = mapped_column(JSON)


class TrialRow(Base):
    """One stored trial of a study (a StoredTrial's `to_dict`), one row per trial number; its requests go
    with it."""

    __tablename__ = "tuner_trials"
    __table_args__ = (UniqueConstraint("study_id", "trial_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"))
    trial_number: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32))
    engine_config: Mapped[dict] = mapped_column(JSON)
    serve_command: Mapped[str] = mapped_column(Text)
    measurement: Mapped[dict | None] = mapped_column(JSON)
    failure_class: Mapped[str | None] = mapped_column(String(32))
    failure_message: Mapped[str | None] = mapped_column(Text)
    log_excerpt: Mapped[str | None] = mapped_column(Text)
    estimated_max_model_len: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    timings: Mapped[dict] = mapped_column(JSON)
    hardware: Mapped[dict] = mapped_column(JSON)
    vllm_version: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[str] = mapped_column(String(64))
    finished_at: Mapped[str | None] = mapped_column(String(64))
    score: Mapped[dict] = mapped_column(JSON)
    prune_reason: Mapped[str | None] = mapped_column(Text)
    probes: Mapped[list | None] = mapped_column(JSON)  # each probe judged, the first at the reference load
    validation: Mapped[dict | None] = mapped_column(JSON)  # a validation launch's mark; empty for a search trial
    trace_fit: Mapped[dict | None] = mapped_column(JSON)  # how its trace was fitted to max_model_len; empty: unfitted


class RequestRow(Base):
    """One replayed request of a trial (a RequestRecord's `to_dict`); times in seconds, None where unmeasured."""

    __tablename__ = "tuner_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id", ondelete="CASCADE"), index=True)
    # "index" is a reserved word in SQL; the attribute keeps the record's name.
    index: Mapped[int] = mapped_column("request_index", Integer)
    scheduled_s: Mapped[float] = mapped_column(Float)
    sent_s: Mapped[float | None] = mapped_column(Float)
    requested_tokens: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(32))
    ttft_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    itl_mean_s: Mapped[float | None] = mapped_column(Float)
    itl_p95_s: Mapped[float | None] = mapped_column(Float)
    itl_max_s: Mapped[float | None] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    queue_s: Mapped[float | None] = mapped_column(Float)  # the server's own figure; none for older trials


class RunRow(Base):
    """One run of a study (a StoredRun's `to_dict`); it goes with its study."""

    __tablename__ = "tuner_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), index=True)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float] = mapped_column(Float)
    slots: Mapped[int] = mapped_column(Integer)
    gpus_per_slot: Mapped[int] = mapped_column(Integer)
    trials: Mapped[list] = mapped_column(JSON)
    budget_s: Mapped[float | None] = mapped_column(Float)


class ScheduleRunRow(Base):
    """One run of a schedule and its morning summary (a StoredScheduleRun's `to_dict`)."""

    __tablename__ = "tuner_schedule_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule: Mapped[str] = mapped_column(String(191), index=True)
    study: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(32))
    due_at: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[str] = mapped_column(String(64))
    window_end: Mapped[str] = mapped_column(String(64))
    finished_at: Mapped[str | None] = mapped_column(String(64))
    summary: Mapped[dict] = mapped_column(JSON)  # trials, best, previous_best, stopped_early, error
