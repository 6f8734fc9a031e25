"""Where a study lives: one database for Optuna's tables and tuner's, and a folder for trial artifacts.

tuner's tables are migrated the first time this process opens a database, not on every request: an Alembic
upgrade reads every migration script, which a service answering many requests should not repeat.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

from tuner.common.errors import NotFound
from tuner.storage import Repository
from tuner.storage.artifacts import trial_dir
from tuner.storage.urls import default_artifact_dir, default_storage_url
from tuner.workers.probe_log import PROBE_LOG, ProbeLog

# The storage has heartbeats, which Optuna marks experimental, and Optuna warns when a study with heartbeats
# asks for a trial outside study.optimize: the runner drives heartbeats itself (tuner.study.runner), deliberately.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
optuna.logging.set_verbosity(optuna.logging.WARNING)

_migrated_urls: set[str] = set()  # databases whose tables this process brought to the newest revision
_migrating = threading.Lock()  # one upgrade at a time: the service answers requests on several threads


def _migrated_already(repo: Repository, url: str) -> bool:
    """Whether this process migrated the database at `url` and it still holds those tables."""
    if url not in _migrated_urls:
        return False
    if repo.engine.dialect.name != "sqlite":
        return True
    # Each engine has an in-memory database of its own, and a file removed since (a test's database made
    # again) starts empty.
    database = repo.engine.url.database
    return bool(database) and database != ":memory:" and Path(database).exists()


class RetryCutTrial(RetryHeartbeatStaleTrialCallback):
    """Queues a trial whose driver stopped (its heartbeat went stale) to run once more, and a re-run again only if
    it finished probes of its own: each re-run goes on after the probes kept (tuner.workers.probe_log), so a long
    trial cut off again and again still ends, and one that gets nowhere is not re-run forever."""

    def __init__(self, artifact_dir: Path):
        super().__init__()
        self.artifact_dir = artifact_dir

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Queue `trial`'s configuration again (`ProbeLog.runs_again`)."""
        log = ProbeLog(trial_dir(self.artifact_dir, study.study_name, trial.number) / PROBE_LOG)
        if not log.runs_again(rerun=bool(self.retry_history(trial))):
            return
        super().__call__(study, trial)


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
        """tuner's tables in the plan's database, at the newest revision: migrated on the first call of the process
        for this URL (a failed migration is tried again next call); DatabaseUnreachable if it cannot be reached."""
        repo = Repository(self.url)
        with _migrating:
            if not _migrated_already(repo, self.url):
                repo.migrate()
                _migrated_urls.add(self.url)
        return repo

    def optuna_storage(self) -> RDBStorage:
        """Optuna's storage in the plan's database, with the heartbeat that marks a silent trial's driver dead."""
        return RDBStorage(self.url, heartbeat_interval=self.heartbeat_interval_s, grace_period=self.grace_period_s,
                          heartbeat_stale_trial_callback=RetryCutTrial(self.artifact_dir))


def load_optuna_study(name: str, plan: StoragePlan) -> optuna.Study:
    """The Optuna side of the stored study `name`; NotFound if there is none."""
    try:
        return optuna.load_study(study_name=name, storage=plan.optuna_storage())
    except KeyError:
        raise NotFound(f"no study named {name}") from None
