"""A study's answer: the configuration it recommends under its boundary, beside vLLM's default one, and the
sentence that compares the two. Reading it needs the database only (no Ray, no engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tuner.analysis.diagnosis import EngineCaps, LimitingResource, limiting_resource
from tuner.analysis.scoring import Boundary, Score, boundary, capacity_line
from tuner.storage import Repository, StoredTrial, StudySettings, TrialState
from tuner.study.attrs import BASELINE_ATTR
from tuner.validation import Validation, latest_validation

if TYPE_CHECKING:
    import optuna

    from tuner.workers.engine_config import EngineConfig


# Completed throughput within this share of the best counts as a tie, settled by the lower p95: in an open
# loop every configuration that keeps up completes at about the offered rate.
THROUGHPUT_TIE = 0.01


class ComparedDefault(Protocol):
    """What the gain sentence needs of vLLM's default configuration as run: its trial number, how it ended
    (a trial state's value), its failure class if it failed, and whether it met the boundary. `DefaultRun` and
    the service's answer (`tuner.studies.BaselineAnswer`) both provide it."""

    @property
    def trial(self) -> int:
        """The default's trial number."""
        ...

    @property
    def state(self) -> str:
        """How its trial ended: a TrialState's value."""
        ...

    @property
    def failure_class(self) -> str | None:
        """Its failure class; None unless it failed."""
        ...

    @property
    def feasible(self) -> bool:
        """Whether it completed, was scored and met the boundary."""
        ...


@dataclass(frozen=True)
class DefaultRun:
    """vLLM's default configuration as a study ran it, as far as a comparison needs (see `ComparedDefault`)."""

    trial: int
    state: str
    failure_class: str | None
    feasible: bool  # complete, scored and within the boundary


@dataclass(frozen=True)
class Recommendation:
    """The configuration a study recommends under its boundary, vLLM's default one to compare it with, and the
    validation that chose between them (None while the study was not validated)."""

    trial: StoredTrial  # scored; the search trial of the validated winner, or vLLM's default when it stays
    boundary: Boundary
    baseline: StoredTrial | None  # vLLM's default configuration, as run first
    validation: Validation | None = None
    others_carry: bool = False  # another search trial carried your traffic (the default stayed after validation)
    # Where the recommendation changes the model's numerics (FP8): the best configuration at its own precision,
    # shown beside it (validated too where the validation launched it). None otherwise, or where none was found.
    own_precision: StoredTrial | None = None

    def numerics_sentence(self, dtype: str) -> str | None:
        """What the recommendation changes of the model's numerics, in one sentence; None where it changes
        nothing: `weights and KV cache in FP8: outputs differ from bfloat16; check your own quality evaluations`."""
        what = self.trial.engine_config.numerics_text()
        return f"{what}: outputs differ from {dtype}; check your own quality evaluations" if what else None

    def own_precision_gain(self) -> str:
        """The validated gain of `own_precision` over vLLM's default (`GainInterval.text`), or why there is none."""
        own, validation = self.own_precision, self.validation
        arm = validation.arm_of(own.trial_number) if own is not None and validation is not None else None
        if arm is None:
            return "not validated"
        gain = validation.gain_of(arm)
        return f"against vLLM's default: {gain.text()}" if gain is not None else arm.nothing_carried()

    @property
    def default_run(self) -> DefaultRun | None:
        """The baseline as the gain sentence states it; None when the study did not run it."""
        base = self.baseline
        if base is None:
            return None
        return DefaultRun(base.trial_number, base.state, base.failure_class, base.feasible)

    def shortfall(self) -> str | None:
        """`shortfall_sentence` when the recommendation does not carry your traffic within the boundary; else None."""
        score = self.trial.scored
        return None if score is None or score.feasible else shortfall_sentence(score.violations, self.others_carry)

    def gain_sentence(self, *, report: bool = False) -> str:
        """`gain_sentence` for this recommendation (the report's form with `report=True`)."""
        verdict = self.validation.sentence() if self.validation is not None else None
        return gain_sentence(self.default_run, verdict, self.trial.trial_number, report=report)


def gain_sentence(default: ComparedDefault | None, validated: str | None, recommended: int, *,
                  report: bool = False) -> str:
    """The one sentence on a recommendation's (trial number `recommended`) gain over vLLM's default
    configuration. A validated study states its validation's verdict (`validated`, `Validation.sentence`: the
    gain with its 95% interval and repeats, and whether to keep the default). Otherwise no gain is stated, as one
    measurement of each cannot give one: the sentence says "not validated", or why there is nothing to compare
    (the default was not run, failed, or gave no score).

    The command line's form (the default) is a clause; `report=True` gives the report's form: a sentence with a
    capital and a full stop."""
    if validated is not None:
        text = validated
    elif default is None:
        text = "vLLM's default configuration was not run in this study; not validated"
    elif default.trial == recommended:
        text = (f"vLLM's default configuration (trial {default.trial}) is itself the best found, measured once: "
                "not validated")
    elif default.state != "complete":
        why = default.failure_class or default.state
        text = f"vLLM's default configuration (trial {default.trial}) gave no score to compare: {why}; not validated"
    else:
        broke = "" if default.feasible else ", and the default broke the boundary at your traffic"
        text = (f"against vLLM's default configuration (trial {default.trial}): not validated, each was measured "
                f"once{broke}; `tuner study validate` states the gain with its interval")
    return as_sentence(text) if report else text


def as_sentence(clause: str) -> str:
    """A clause as a sentence: a capital first, but vLLM keeps its own case ("VLLM's default" is no name), and a
    full stop."""
    first = clause[0] if clause.startswith("vLLM") else clause[0].upper()
    return f"{first}{clause[1:]}."


def capacity_sentence(score: Score, reference_rps: float | None) -> str:
    """What a searched configuration carries and what today's traffic gets from it: `carries 8.1 req/s (x5.6 the
    trace's rate) within the boundary; at your traffic (2.9 req/s) p95 end-to-end is 5.8 s`, with the traffic it
    carries whole where its max_model_len clipped some requests."""
    capacity = score.capacity
    assert capacity is not None, "a capacity sentence is for a searched trial"
    traffic = f"at your traffic ({reference_rps:.3g} req/s)" if reference_rps else "at your traffic"
    load = capacity_line(capacity)
    carried = (f"carries {load} within the boundary" if load is not None
               else f"carries none of the loads probed within the boundary ({capacity.ended})")
    if load is not None and score.whole_share < 1:
        carried += (f", {score.carried_rps:.3g} req/s of it whole ({1 - score.whole_share:.0%} of the requests were "
                    f"clipped to its max_model_len, which vLLM would refuse)")
    return f"{carried}; {traffic} p95 end-to-end is {score.e2e_p95_s:.3g} s"


def validation_terms(settings: StudySettings) -> tuple[bool, float]:
    """How a study's validation launches are read: whether they searched their capacity, and the resolution of
    what they measured (the load search's precision; at a fixed load, the throughput tie)."""
    searched = settings.load.mode == "search"
    return searched, settings.load.precision if searched else THROUGHPUT_TIE


def find_baseline(trials: list[StoredTrial], optuna_study: optuna.Study) -> StoredTrial | None:
    """vLLM's default configuration as run in the study: its completed run if any, else its first try; None
    when the study has not run it."""
    numbers = {t.number for t in optuna_study.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR)}
    baselines = [t for t in trials if t.trial_number in numbers and t.validation is None]
    return next((t for t in baselines if t.state is TrialState.COMPLETE), baselines[0] if baselines else None)


def candidates(trials: list[StoredTrial]) -> list[StoredTrial]:
    """The search trials a recommendation is chosen from: those that carry your traffic within the boundary (the
    feasible ones); when none does, those whose load search found some lower load within it, so that a study on a
    machine too small for your traffic still says which configuration carries the most of it (`shortfall_sentence`
    says that it falls short). Validation launches are never candidates."""
    search = [t for t in trials if t.validation is None]
    feasible = [t for t in search if t.feasible]
    if feasible:
        return feasible
    return [t for t in search if t.state is TrialState.COMPLETE and t.scored is not None
            and t.scored.capacity is not None and t.scored.capacity.rps is not None]


def finalists(trials: list[StoredTrial], top: int, default: EngineConfig, baselines: set[int]) -> list[int]:
    """The trial numbers a validation launches against vLLM's default (`default`, its trials `baselines`): the
    `top` candidate search trials (`candidates`) by capacity (at a fixed load, completed throughput), one per
    configuration, none of them the default. Where all of those change the model's numerics (FP8), the best at the
    model's own precision too, so that the answer states both gains."""
    seen: list[EngineConfig] = [default]
    chosen: list[StoredTrial] = []
    ranked = sorted((t for t in candidates(trials) if t.trial_number not in baselines),
                    key=lambda t: -t.scored.objectives[0])
    for t in ranked:
        if t.engine_config not in seen and len(chosen) < top:
            seen.append(t.engine_config)
            chosen.append(t)
    if chosen and all(t.engine_config.changes_numerics for t in chosen):
        own = next((t for t in ranked if not t.engine_config.changes_numerics and t.engine_config not in seen), None)
        chosen += [own] if own is not None else []
    return [t.trial_number for t in chosen]


def carried_by_others(trials: list[StoredTrial], number: int) -> bool:
    """Whether a search trial other than trial `number` carried your traffic within the boundary."""
    return any(t.feasible for t in trials if t.validation is None and t.trial_number != number)


def shortfall_sentence(violations: list[str], others_carry: bool = False) -> str:
    """What a recommendation that does not carry your traffic says of it (`violations`: how it breaks the
    boundary at your traffic). Either no configuration tried does, or (`others_carry`) some did, yet validation
    kept vLLM's default: none carried more than it beyond noise when launched again."""
    broken = f"it does not carry your traffic within the boundary ({'; '.join(violations)})"
    if others_carry:
        return (f"{broken} as the search measured it; other configurations tried did, yet launched again none "
                "carried more than vLLM's default beyond noise")
    return f"{broken}, and no configuration tried does: it carries the most of it"


def recommend(repo: Repository, settings: StudySettings, optuna_study: optuna.Study) -> Recommendation | None:
    """After a validation (the newest complete one), its winner: the finalist that carries more than vLLM's
    default beyond noise, else the default. Before any, the candidate search trial (`candidates`) with the highest
    capacity (at a fixed load: completed throughput), near-ties going to the lower p95 latency at the reference
    load. With the study's boundary and its baseline; None while there is no candidate."""

    trials = repo.trials(settings.name)
    baseline = find_baseline(trials, optuna_study)
    bound = boundary(settings.boundary, settings.limits)
    validation = latest_validation(trials, *validation_terms(settings))
    if validation is not None:
        winner = validation.winner
        by_number = {t.trial_number: t for t in trials}
        if winner.arm.of_trial is not None:
            chosen = by_number[winner.arm.of_trial]
            return Recommendation(chosen, bound, baseline, validation,
                                  own_precision=own_precision_best(trials, chosen, validation))
        # vLLM's default stays: as the search ran it, or else its first validation launch that was scored.
        kept = baseline if baseline is not None and baseline.scored is not None else next(
            (by_number[n] for n in winner.trials if by_number[n].scored is not None), None)
        if kept is not None:
            return Recommendation(kept, bound, baseline, validation, carried_by_others(trials, kept.trial_number))
    found = candidates(trials)
    if not found:
        return None
    # Capacities within the search's precision cannot be told apart; completed throughputs within 1% neither.
    tie = settings.load.precision if settings.load.mode == "search" else THROUGHPUT_TIE
    top = max(t.scored.objectives[0] for t in found)
    contenders = [t for t in found if t.scored.objectives[0] >= top * (1 - tie)]
    best = min(contenders, key=lambda t: (t.scored.e2e_p95_s, -t.scored.objectives[0]))
    return Recommendation(best, bound, baseline, own_precision=own_precision_best(trials, best, None))


def own_precision_best(trials: list[StoredTrial], chosen: StoredTrial, validation: Validation | None
                       ) -> StoredTrial | None:
    """Where `chosen` changes the model's numerics, the best candidate at the model's own precision: the one the
    validation launched beside it, else the search's best by capacity. None where `chosen` changes nothing."""
    if not chosen.engine_config.changes_numerics:
        return None
    own = [t for t in candidates(trials) if not t.engine_config.changes_numerics]
    validated = [t for t in own if validation is not None and validation.arm_of(t.trial_number) is not None]
    return max(validated or own, key=lambda t: t.scored.objectives[0], default=None)


def best_trials(repo: Repository, settings: StudySettings, optuna_study: optuna.Study) -> list[StoredTrial]:
    """The candidate trials (`candidates`), the recommendation first and then by capacity (at a fixed load,
    completed throughput)."""
    rec = recommend(repo, settings, optuna_study)
    if rec is None:
        return []
    others = [t for t in candidates(repo.trials(settings.name)) if t.trial_number != rec.trial.trial_number]
    return [rec.trial, *sorted(others, key=lambda t: -t.scored.objectives[0])]


def trial_limit(t: StoredTrial, bound: Boundary) -> LimitingResource | None:
    """What holds a stored trial back: at its edge probe after a load search, else at its one measurement; None
    when it measured nothing."""
    return limiting_resource(t.probes, t.measurement, EngineCaps.of(t.engine_config.to_dict(), t.hardware),
                             bound=bound)
