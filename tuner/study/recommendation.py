"""A study's answer: the configuration it recommends under its boundary, beside vLLM's default one. Reading
it needs the database only (no Ray, no engine)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.scoring import Boundary, boundary
from tuner.storage import Repository, StoredTrial, StudySettings, TrialState
from tuner.study.attrs import BASELINE_ATTR

if TYPE_CHECKING:
    import optuna


# Completed throughput within this share of the best counts as a tie, settled by the lower p95: in an open
# loop every configuration that keeps up completes at about the offered rate.
THROUGHPUT_TIE = 0.01


@dataclass(frozen=True)
class Recommendation:
    """The configuration a study recommends under its boundary, and vLLM's default one to compare it with."""

    trial: StoredTrial  # feasible: complete and scored
    boundary: Boundary
    baseline: StoredTrial | None  # vLLM's default configuration, as run first

    @property
    def gain(self) -> dict[str, float] | None:
        """Throughput and p95 of the recommendation over the baseline's, when the baseline was scored."""
        base = self.baseline.scored if self.baseline is not None else None
        if base is None or not base.completed_rps:
            return None
        rec = self.trial.scored
        return {"completed_rps_ratio": rec.completed_rps / base.completed_rps,
                "e2e_p95_ratio": rec.e2e_p95_s / base.e2e_p95_s if base.e2e_p95_s else math.nan}


def find_baseline(trials: list[StoredTrial], optuna_study: optuna.Study) -> StoredTrial | None:
    """vLLM's default configuration as run in the study: its completed run if any, else its first try."""
    numbers = {t.number for t in optuna_study.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR)}
    baselines = [t for t in trials if t.trial_number in numbers]
    return next((t for t in baselines if t.state is TrialState.COMPLETE), baselines[0] if baselines else None)


def recommend(repo: Repository, settings: StudySettings, optuna_study: optuna.Study) -> Recommendation | None:
    """The feasible trial with the highest completed throughput (near-ties to the lower p95 latency)."""
    trials = repo.trials(settings.name)
    feasible = [t for t in trials if t.feasible]
    baseline = find_baseline(trials, optuna_study)
    bound = boundary(settings.boundary, settings.limits)
    if not feasible:
        return None
    top = max(t.scored.completed_rps for t in feasible)
    contenders = [t for t in feasible if t.scored.completed_rps >= top * (1 - THROUGHPUT_TIE)]
    best = min(contenders, key=lambda t: (t.scored.e2e_p95_s, -t.scored.completed_rps))
    return Recommendation(best, bound, baseline)


def best_trials(repo: Repository, settings: StudySettings, optuna_study: optuna.Study) -> list[StoredTrial]:
    """The feasible trials, the recommendation first and then by completed throughput."""
    rec = recommend(repo, settings, optuna_study)
    if rec is None:
        return []
    others = [t for t in repo.trials(settings.name) if t.feasible and t.trial_number != rec.trial.trial_number]
    return [rec.trial, *sorted(others, key=lambda t: -t.scored.completed_rps)]
