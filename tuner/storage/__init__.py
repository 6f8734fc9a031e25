"""What tuner remembers, in tables of its own beside Optuna's in the same database."""

from tuner.storage.artifacts import attach_trial_artifacts, trial_artifacts, trial_dir
from tuner.storage.records import StoredScheduleRun, StoredTrial, StudyModel, StudySettings, TrialState, ValidationMark
from tuner.storage.repository import DatabaseUnreachable, Repository, alembic_config
from tuner.storage.schema import VERSION_TABLE
from tuner.storage.urls import default_artifact_dir, default_storage_url, redact_url

__all__ = [
    "VERSION_TABLE", "DatabaseUnreachable", "Repository", "StoredScheduleRun", "StoredTrial", "StudyModel",
    "ValidationMark", "StudySettings", "TrialState", "alembic_config", "attach_trial_artifacts", "default_artifact_dir",
    "default_storage_url", "redact_url", "trial_artifacts", "trial_dir",
]
