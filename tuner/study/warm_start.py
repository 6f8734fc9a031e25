"""Warm start: a new study begins where an earlier one got to, its best configurations queued to run right
after the baseline."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.common.errors import TunerError
from tuner.storage import Repository, StudySettings
from tuner.study.attrs import WARM_START_ATTR
from tuner.study.create import enqueue_config, stored_space
from tuner.study.plan import StoragePlan, load_optuna_study
from tuner.study.recommendation import best_trials, recommend
from tuner.workers.engine_config import EngineConfig

WARM_START_LIMIT = 4  # the best few configurations are carried over, not the whole earlier study


@dataclass(frozen=True)
class WarmStart:
    """What a warm start queued: the earlier study's best configurations, and those the new space refused."""

    source: str  # the earlier study
    trials: list[int]  # its trials whose configurations were queued, best first
    configs: list[EngineConfig]
    skipped: list[str]  # configurations that the new study's space refuses, and why

    def to_dict(self) -> dict:
        """JSON-ready: what the new study's Optuna attribute `warm_start` and the commands' answers hold."""
        return {"from": self.source, "trials": self.trials, "configs": [c.to_dict() for c in self.configs],
                "skipped": self.skipped}


def previous_study(repo: Repository, settings: StudySettings, plan: StoragePlan) -> StudySettings | None:
    """The most recent study created before this one on the same model and the same search space that found a
    configuration meeting its boundary."""
    same = (settings.model, settings.space_name, settings.space_text)
    for earlier in reversed(repo.list_studies()):
        if (earlier.name != settings.name and earlier.created_at <= settings.created_at
                and (earlier.model, earlier.space_name, earlier.space_text) == same
                and recommend(repo, earlier, load_optuna_study(earlier.name, plan)) is not None):
            return earlier
    return None


def warm_start(name: str, plan: StoragePlan, source: str | None = None) -> WarmStart | None:
    """Queue the best configurations of an earlier study (`source`, else `previous_study`) to run right after
    the baseline, ahead of the sampler; None when there is no such study.

    vLLM's default configuration is left out (every study runs it first anyway), and so are repeats."""
    repo = plan.repository()
    settings = repo.get_study(name)
    earlier = repo.get_study(source) if source is not None else previous_study(repo, settings, plan)
    if earlier is None:
        return None
    space = stored_space(settings)
    chosen: list[tuple[int, EngineConfig]] = []
    skipped: list[str] = []
    seen: set[tuple] = set()
    for trial in best_trials(repo, earlier, load_optuna_study(earlier.name, plan)):
        config = trial.engine_config
        searched = tuple(sorted((k, v) for k, v in config.to_dict().items() if k in space.parameters))
        if not searched or searched in seen:
            continue
        seen.add(searched)
        origin = {WARM_START_ATTR: f"{earlier.name} trial {trial.trial_number}"}
        try:
            enqueue_config(name, plan, config, user_attrs=origin)
        except TunerError as exc:
            skipped.append(f"trial {trial.trial_number}: {exc}")
            continue
        chosen.append((trial.trial_number, config))
        if len(chosen) == WARM_START_LIMIT:
            break
    warm = WarmStart(earlier.name, [n for n, _ in chosen], [c for _, c in chosen], skipped)
    load_optuna_study(name, plan).set_user_attr("warm_start", warm.to_dict())
    return warm
