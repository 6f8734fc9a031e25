"""The bottleneck sampler: read what vLLM reported for the best configuration so far and relieve its bottleneck.

A person tuning vLLM by hand reads the engine's own figures: preemptions or a full KV cache mean the cache is
short, requests waiting while every sequence slot is taken mean max_num_seqs caps concurrency, requests waiting
(or first tokens late) with slots free mean the per-step token budget admits prefills too slowly. This sampler
does the same between trials: it takes the best measured configuration, diagnoses it from the figures each
trial leaves in its user attributes (`measurement_attrs`), and proposes that configuration with the
bottlenecked settings moved towards more room. When no trial shows a bottleneck it can relieve (or the move
was already tried) it hands the proposal to TPE, which also makes the first proposals.

It never lowers a setting: lowering max_num_seqs silences preemptions but moves the delay into the waiting
queue, which only a measurement can weigh, so TPE is left to explore that side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from tuner.analysis.diagnosis import Figures, Signs
from tuner.analysis.scoring import TTFT_LIMITS
from tuner.workers.measure import Measurement

# The settings that size the KV cache, whichever of them a space searches.
KV_SETTINGS = ("gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override")
# The precision levers, each the choice that relieves one limit, where the space offers it (only a study that
# allows FP8 does): an fp8 KV cache holds twice the tokens; fp8 weights leave memory to the cache and compute a
# prefill faster on Hopper.
KV_LEVER = ("kv_cache_dtype", "fp8")
COMPUTE_LEVER = ("quantization", "fp8")
INCUMBENTS = 3  # how many of the best trials are diagnosed before handing over to TPE
RELIEF_ATTR = "bottleneck_relief"  # user attribute of a trial this sampler proposed: which move, from which trial


def measurement_attrs(m: Measurement) -> dict[str, Any]:
    """The figures a finished trial keeps as Optuna user attributes: shown by the dashboard, read by the
    bottleneck sampler."""
    return {"completed": m.completed, "requests": m.requests, "preemptions": m.preemptions,
            "ttft_p95_s": m.ttft_s.p95, "e2e_p95_s": m.e2e_s.p95, "output_tps": m.output_tps,
            "queue_p95_s": m.queue_s_p95, "kv_usage_peak": m.kv_usage_peak,
            "running_peak": m.running_peak, "waiting_peak": m.waiting_peak}


@dataclass(frozen=True)
class Diagnosis(Signs):
    """What held one measured configuration back, from vLLM's own figures: the signs of `tuner.analysis.diagnosis`, read
    from a trial's user attributes."""

    @classmethod
    def of(cls, trial: FrozenTrial) -> Diagnosis:
        """The diagnosis of one measured Optuna trial, from the figures in its user attributes (a figure it lacks shows
        no sign) and the sequence cap it searched (a cap it did not search counts as never reached)."""
        ttft_over = trial.state == TrialState.COMPLETE and any(trial.constraints.get(name, 0.0) > 0
                                                               for name in TTFT_LIMITS)
        return cls.read(Figures.from_attrs(trial.user_attrs), trial.params.get("max_num_seqs"), ttft_over)

    def settings(self) -> tuple[str, ...]:
        """The settings to raise: the KV budget first of all (more sequences would only preempt more)."""
        names: list[str] = []
        if self.kv_short:
            names += KV_SETTINGS
        if self.seqs_capped:
            names.append("max_num_seqs")
        if self.prefill_slow:
            names.append("max_num_batched_tokens")
        return tuple(names)

    def levers(self) -> tuple[tuple[str, Any], ...]:
        """The precision levers that fit the limits shown: FP8 KV for a KV cache short, FP8 weights for first
        tokens late with slots free (prefill compute)."""
        return tuple(lever for lever, shown in ((KV_LEVER, self.kv_short), (COMPUTE_LEVER, self.prefill_slow))
                     if shown)


def raised(value: Any, distribution: BaseDistribution) -> Any | None:
    """The next value up from `value` within `distribution`: halfway to the top (geometrically on a log scale)
    for a range, the next larger choice for numeric choices; None when there is no room."""
    if isinstance(distribution, CategoricalDistribution):
        numbers = sorted(c for c in distribution.choices if isinstance(c, (int, float)) and not isinstance(c, bool))
        larger = [c for c in numbers if c > value]
        return larger[0] if larger else None
    if not isinstance(distribution, (IntDistribution, FloatDistribution)) or value >= distribution.high:
        return None
    low, high = distribution.low, distribution.high
    middle = math.sqrt(value * high) if distribution.log and value > 0 else (value + high) / 2
    step = distribution.step
    if step is not None:  # onto the distribution's grid, low + k * step, and up by at least one step
        middle = low + max(math.ceil((middle - low) / step - 1e-9), round((value - low) / step) + 1) * step
    elif isinstance(distribution, IntDistribution):
        middle = max(math.ceil(middle), value + 1)
    middle = min(middle, high)
    if isinstance(distribution, IntDistribution):
        return int(middle)
    decimals = max(0, -int(math.floor(math.log10(step)))) + 2 if step else None
    return round(middle, decimals) if decimals is not None else middle


def _rank(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Measured trials, best first: feasible ones by throughput, then infeasible ones by throughput, then
    those stopped early (their figures still show the bottleneck)."""
    def key(t: FrozenTrial) -> tuple:
        complete = t.state == TrialState.COMPLETE
        feasible = complete and all(v <= 0 for v in t.constraints.values())
        throughput = t.values[0] if complete and t.values else 0.0
        return (not complete, not feasible, -throughput)
    return sorted((t for t in trials if t.params and "preemptions" in t.user_attrs), key=key)


@dataclass(frozen=True)
class ReliefMove:
    """The next configuration to try, and why: a best trial's parameters with its bottleneck's settings raised."""

    params: dict[str, Any]  # the next trial's parameters
    note: str  # why, for people: "trial 3: raise gpu_memory_utilization 0.45 -> 0.7"


def relief_move(trials: Sequence[FrozenTrial], space: dict[str, BaseDistribution]) -> ReliefMove | None:
    """The best trial whose bottleneck can still be relieved, with those settings raised. None when none of the
    best few has such a move left that was not already tried."""
    tried = [t.params for t in trials if t.params]
    for incumbent in _rank(trials)[:INCUMBENTS]:
        params = dict(incumbent.params)
        if set(params) != set(space):
            continue
        moves = []
        diagnosis = Diagnosis.of(incumbent)
        for name in diagnosis.settings():
            value = raised(params[name], space[name]) if name in space else None
            if value is not None:
                moves.append(f"{name} {params[name]} -> {value}")
                params[name] = value
        for name, value in diagnosis.levers():
            offered = space.get(name)
            if isinstance(offered, CategoricalDistribution) and value in offered.choices and params[name] != value:
                moves.append(f"{name} {params[name]} -> {value}")
                params[name] = value
        if moves and params not in tried:
            return ReliefMove(params, f"trial {incumbent.number}: move " + ", ".join(moves))
    return None


class BottleneckSampler(BaseSampler):
    """Relieves the measured bottleneck of the best configurations so far; TPE proposes everything else."""

    def __init__(self, base: BaseSampler):
        self._base = base

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """Optuna's BaseSampler.infer_relative_search_space: the distributions of the latest measured (complete or
        pruned) trial with the most parameters (not the precision check, which sets a few on vLLM's default); empty
        before there is one."""
        measured = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
                    if t.params]
        return dict(max(measured, key=lambda t: (len(t.params), t.number)).distributions) if measured else {}

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """Optuna's BaseSampler.sample_relative: the relief move of the best trials so far (noted in the trial's
        RELIEF_ATTR user attribute) when there is one, else what the base sampler proposes over its own search space."""
        if search_space:
            move = relief_move(study.get_trials(deepcopy=False), search_space)
            if move is not None:
                # Through the storage, as Optuna's own samplers note their reasons: a user attribute, so the
                # dashboard shows why this configuration was tried.
                study._storage.set_trial_user_attr(trial._trial_id, RELIEF_ATTR, move.note)
                return move.params
        return self._base.sample_relative(study, trial, self._base.infer_relative_search_space(study, trial))

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        """Optuna's BaseSampler.sample_independent: left to the base sampler."""
        return self._base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        """Optuna's BaseSampler.before_trial: passed on to the base sampler."""
        self._base.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        """Optuna's BaseSampler.after_trial: passed on to the base sampler."""
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Optuna's BaseSampler.reseed_rng: reseeds the base sampler."""
        self._base.reseed_rng()
