"""A stored study opened for a run: what every part of the run reads (its settings and context, its Optuna study)
and where each writes (its tables, its artifacts), and the questions about its trials that all of them ask."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from tuner.search.samplers import make_sampler
from tuner.storage import Repository, StoredTrial, StudySettings, ValidationMark
from tuner.storage.artifacts import trial_dir
from tuner.study.attrs import BASELINE_ATTR, ON_DEFAULT_ATTR, RERUN_ATTR, VALIDATION_ATTR
from tuner.study.create import StudyContext, study_context
from tuner.study.plan import StoragePlan
from tuner.study.recommendation import finalists
from tuner.workers.probe_log import PROBE_LOG, ProbeLog


@dataclass(frozen=True)
class OpenStudy:
    """A stored study made ready to run (`study_context`), with its Optuna study and where its records go."""

    plan: StoragePlan
    repo: Repository
    settings: StudySettings
    ctx: StudyContext
    storage: RDBStorage
    study: optuna.Study

    @classmethod
    def open(cls, name: str, plan: StoragePlan) -> OpenStudy:
        """Study `name` as `plan` stores it, its sampler set."""
        repo = plan.repository()
        settings = repo.get_study(name)
        storage = plan.optuna_storage()
        study = optuna.load_study(study_name=name, storage=storage)
        study.sampler = make_sampler(settings.sampler, settings.seed)
        return cls(plan, repo, settings, study_context(settings), storage, study)

    def trials(self) -> list[StoredTrial]:
        """The study's trials as stored in the project's tables."""
        return self.repo.trials(self.settings.name)

    def waiting(self) -> list[FrozenTrial]:
        """The trials queued and not yet asked for, in the order they will be."""
        return self.study.get_trials(deepcopy=False, states=(OptunaState.WAITING,))

    def baselines(self) -> set[int]:
        """The numbers of the study's trials of vLLM's default configuration queued as its baseline."""
        return {t.number for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR)}

    def finalists(self, trials: list[StoredTrial], top: int) -> list[int]:
        """`finalists` of the study's trials: none of them vLLM's default."""
        return finalists(trials, top, self.ctx.space.baseline(), self.baselines())

    def trial_dir(self, number: int) -> Path:
        """Where trial `number`'s files are kept."""
        return trial_dir(self.plan.artifact_dir, self.settings.name, number)

    def probe_log(self, number: int) -> ProbeLog:
        """Trial `number`'s probes as they ended, kept for a re-run to go on after."""
        return ProbeLog(self.trial_dir(number) / PROBE_LOG)

    def attempt(self, trial: optuna.Trial | FrozenTrial) -> int:
        """1 for a first run; a configuration re-run after its driver died counts its earlier tries."""
        return len(self._retried(trial)) + 1

    def rerun_of(self, trial: optuna.Trial | FrozenTrial) -> int | None:
        """The trial this one runs again, cut off before it finished: the last of Optuna's retries (its driver
        stopped), else the one a lost worker or a stopped run left (RERUN_ATTR); None for a first run."""
        history = self._retried(trial)
        return history[-1] if history else trial.user_attrs.get(RERUN_ATTR)

    def _retried(self, trial: optuna.Trial | FrozenTrial) -> list[int]:
        """The trials Optuna failed by their stale heartbeat that `trial` runs again, the first first."""
        return RetryHeartbeatStaleTrialCallback.retry_history(self.study.get_trials(deepcopy=False)[trial.number])


def kept_attrs(trial: optuna.Trial | FrozenTrial) -> dict[str, Any]:
    """What a launch of `trial`'s configuration again (a validation launch, a re-run) keeps of its user attributes:
    which settings it changes from vLLM's default, where it changes only those."""
    return {k: trial.user_attrs[k] for k in (ON_DEFAULT_ATTR,) if k in trial.user_attrs}


def mark_of(trial: optuna.Trial | FrozenTrial) -> ValidationMark | None:
    """The validation mark of a validation launch; None for a search trial."""
    data = trial.user_attrs.get(VALIDATION_ATTR)
    return ValidationMark.from_dict(data) if data else None
