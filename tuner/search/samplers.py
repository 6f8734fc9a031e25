"""The samplers a study can use, by name, and how a seed makes their proposals reproducible.

A seed is applied per trial: the sampler that proposes trial N is seeded with seed + N. Trial numbers are unique
within a study, so a second run of the study, or a second driver on the same study, never replays the proposals
of the first, and the proposal for trial N depends only on the seed, N and the trials before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from tuner.search.bottleneck import BottleneckSampler
from tuner.common.errors import TunerError


def _tpe(seed: int | None) -> BaseSampler:
    # group: the baseline has no parameters, and without groups that empties TPE's joint search space.
    # constant_liar: trials in flight (--parallel) count as bad, so parallel slots do not propose alike.
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                      n_startup_trials=4)


_BUILDERS: dict[str, Callable[[int | None], BaseSampler]] = {
    "bottleneck": lambda seed: BottleneckSampler(_tpe(seed)),
    "tpe": _tpe,
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "nsga2": lambda seed: optuna.samplers.NSGAIISampler(seed=seed, population_size=8),
}
SAMPLERS = tuple(_BUILDERS)
SEED_MAX = 2**32 - 1 - 10**6
DEFAULT_SAMPLER = "bottleneck"


class SeededPerTrial(BaseSampler):
    """A sampler rebuilt for every trial with the seed `seed + trial number`."""

    def __init__(self, build: Callable[[int | None], BaseSampler], seed: int):
        self._build = build
        self._seed = seed
        self._current = build(seed)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        """Optuna's BaseSampler.before_trial, called first for every new trial: rebuilds the sampler with the
        seed `seed + trial number`, then passes the call on to it."""
        # Optuna calls this first for every new trial, before any sampling for it.
        self._current = self._build(self._seed + trial.number)
        self._current.before_trial(study, trial)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """Optuna's BaseSampler.infer_relative_search_space: that of this trial's sampler."""
        return self._current.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """Optuna's BaseSampler.sample_relative: what this trial's sampler proposes."""
        return self._current.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        """Optuna's BaseSampler.sample_independent: what this trial's sampler proposes."""
        return self._current.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        """Optuna's BaseSampler.after_trial: passed on to this trial's sampler."""
        self._current.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Optuna's BaseSampler.reseed_rng: reseeds this trial's sampler (the next trial's is seeded from its number
        again)."""
        self._current.reseed_rng()


def make_sampler(name: str, seed: int | None) -> BaseSampler:
    """The Optuna sampler named `name` (one of SAMPLERS); with a seed it is rebuilt for each trial from `seed + trial
    number`, so that a study's proposals repeat. TunerError for an unknown name, and for a seed numpy refuses (its
    seeds are 0 to 2**32 - 1; trial numbers are added to it, so a seed leaves room for a million trials)."""
    if name not in _BUILDERS:
        raise TunerError(f"unknown sampler {name!r}; one of: {', '.join(SAMPLERS)}")
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise TunerError(f"seed must be between 0 and {SEED_MAX}, got {seed}")
    build = _BUILDERS[name]
    return build(None) if seed is None else SeededPerTrial(build, seed)
