"""Where a study lives: one database for Optuna's tables and tuner's, and a folder for trial artifacts."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from tuner.errors import NotFound
from tuner.storage import Repository
from tuner.storage.urls import default_artifact_dir, default_storage_url

# The storage has heartbeats, which Optuna marks experimental, and Optuna warns when a study with heartbeats
# asks for a trial outside study.optimize: the runner drives heartbeats itself (tuner.study.runner), deliberately.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
optuna.logging.set_verbosity(optuna.logging.WARNING)

@dataclass(frozen=True)
class StoragePlan:
    """Where a study lives: the database URL and the folder of its trial artifacts."""

    url: str
    artifact_dir: Path
    heartbeat_interval_s: int = 30  # a running trial proves its driver alive this often...
    grace_period_s: int = 90  # ...and is taken for interrupted once silent this long

    @classmethod
    def resolve(cls, url: str | None, artifact_dir: str | Path | None = None, **kwargs) -> StoragePlan:
        """The plan for `url` (default: the SQLite file in tuner's home), its artifacts in `artifact_dir` (default:
        the folder that goes with the URL); `kwargs` set the heartbeat's timing."""
        url = url or default_storage_url()
        return cls(url, Path(artifact_dir) if artifact_dir else default_artifact_dir(url), **kwargs)

    def repository(self) -> Repository:
        """tuner's tables in the plan's database, migrated to the newest revision; DatabaseUnreachable if it cannot
        be reached."""
        repo = Repository(self.url)
        repo.migrate()
        return repo

    def optuna_storage(self) -> RDBStorage:
        """Optuna's storage in the plan's database, with the heartbeat that marks a silent trial's driver dead."""
        return RDBStorage(self.url, heartbeat_interval=self.heartbeat_interval_s, grace_period=self.grace_period_s,
                          heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))


def load_optuna_study(name: str, plan: StoragePlan) -> optuna.Study:
    """The Optuna side of the stored study `name`; NotFound if there is none."""
    try:
        return optuna.load_study(study_name=name, storage=plan.optuna_storage())
    except KeyError:
        raise NotFound(f"no study named {name}") from None
