"""A validation read back from its marked launches and judged: each arm's results, the gain of the best over vLLM's
default, and the verdict in words."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.storage import StoredTrial, TrialState

from tuner.validation.design import Arm
from tuner.validation.intervals import GainInterval, gain_interval


@dataclass(frozen=True)
class ArmResult:
    """One arm's launches in a validation: the trial numbers in the order they ran, what each carried (req/s
    within the boundary; 0 for a launch that carried none or failed) and the median."""

    arm: Arm
    trials: tuple[int, ...]
    values: tuple[float, ...]
    failures: tuple[str, ...] = ()  # the failure class of each launch that failed (its value is 0)
    # Per launch, how far above its value the first load that did not pass lay (edge / capacity - 1); infinite
    # where no load above it failed; 0 where it carried none or did not search.
    brackets: tuple[float, ...] = ()
    rounds: tuple[int, ...] = ()  # per launch, its round (`ValidationMark.round`): what pairs it with another arm's

    @property
    def bracket(self) -> float:
        """How far above the geometric mean of its values the arm's may lie: each launch's capacity lies anywhere in
        its own bracket, so their geometric mean within the geometric mean of the launches' 1 + bracket, less 1
        (0 without any; infinite when one is open)."""
        if not self.brackets:
            return 0.0
        return math.exp(statistics.fmean(math.log1p(b) for b in self.brackets)) - 1

    @property
    def median(self) -> float | None:
        """The median of the arm's values so far, in the validation's unit; None before any launch."""
        return statistics.median(self.values) if self.values else None

    @property
    def carried_every_time(self) -> bool:
        """Whether every launch carried some load within the boundary (the ratio's logs need it)."""
        return bool(self.values) and min(self.values) > 0

    def to_dict(self) -> dict[str, Any]:
        """For programs: the arm's label and trial, its launches' trial numbers and values, and the median."""
        return {"label": self.arm.label, "of_trial": self.arm.of_trial, "trials": list(self.trials),
                "values": list(self.values), "median": self.median, "failures": list(self.failures),
                "brackets": [None if math.isinf(b) else b for b in self.brackets]}

    def launches_text(self) -> str:
        """Its launches' values, each with the lowest load above it that did not pass where its search found one:
        `16.3 (23.1), 16.3 (none failed)`."""
        def launch(value: float, bracket: float) -> str:
            if math.isinf(bracket):
                return f"{value:.3g} (none failed)"
            return f"{value:.3g} ({value * (1 + bracket):.3g})" if bracket > 0 else f"{value:.3g}"

        brackets = self.brackets or (0.0,) * len(self.values)
        return ", ".join(launch(v, b) for v, b in zip(self.values, brackets))

    def nothing_carried(self) -> str:
        """How often it carried no load, and why where a launch failed: `trial 3 carried no load within the
        boundary in 1 of 2 launches, of which 1 failed: startup_timeout`."""
        text = (f"{self.arm.label} carried no load within the boundary in {sum(v <= 0 for v in self.values)} of "
                f"{len(self.values)} launches")
        if self.failures:
            text += f", of which {len(self.failures)} failed: {', '.join(sorted(set(self.failures)))}"
        return text


@dataclass(frozen=True)
class Validation:
    """A validation's verdict: each arm's launches, the arm with the best median, and the best finalist's gain
    over vLLM's default with its interval (None when one of them carried nothing in some launch)."""

    run: int
    repeats: int  # as planned, per arm
    arms: tuple[ArmResult, ...]  # the first is vLLM's default
    order: tuple[int, ...]  # the trial numbers in the order they ran
    unit: str  # what the values are: "req/s within the boundary" or "completed req/s"
    resolution: float = 0.0  # values within this share of each other cannot be told apart (see gain_interval)
    paired: bool = False  # every launch measured was a paired round (`ValidationMark.paired`): the gain pairs them
    # How its launches ran and, where not paired, why (`Pairing.text`), as the runner that ran them said; None when
    # judged from the stored trials alone.
    design: str | None = None

    @property
    def default(self) -> ArmResult:
        """vLLM's default: the first arm."""
        return self.arms[0]

    @property
    def against_itself(self) -> bool:
        """An A/A check: vLLM's default against itself."""
        return all(a.arm.of_trial is None for a in self.arms)

    @property
    def complete(self) -> bool:
        """Whether every planned launch has been measured."""
        return all(len(a.values) >= self.repeats for a in self.arms)

    @property
    def finalist(self) -> ArmResult:
        """The contender against the default: the other arm with the best median."""
        return max(self.arms[1:], key=lambda a: a.median if a.median is not None else -1.0)

    @property
    def gain(self) -> GainInterval | None:
        """The finalist over the default; None when either carried nothing in some launch, or lacks 2 launches."""
        return self.gain_of(self.finalist)

    def gain_of(self, arm: ArmResult) -> GainInterval | None:
        """One arm over the default; None when either carried nothing in some launch, or lacks 2 launches."""
        a, b = arm, self.default
        if not (a.carried_every_time and b.carried_every_time and len(a.values) >= 2 and len(b.values) >= 2):
            return None
        values, reference = a.values, b.values
        if self.paired:  # each round's values side by side
            mine, theirs = dict(zip(a.rounds, a.values)), dict(zip(b.rounds, b.values))
            both = sorted(mine.keys() & theirs.keys())
            values, reference = tuple(mine[r] for r in both), tuple(theirs[r] for r in both)
        return gain_interval(values, reference, self.resolution, (a.bracket, b.bracket), paired=self.paired)

    def arm_of(self, trial: int) -> ArmResult | None:
        """The arm that validated search trial `trial`; None where none did."""
        return next((a for a in self.arms if a.arm.of_trial == trial), None)

    @property
    def keep_default(self) -> bool:
        """Whether vLLM's default stays: the finalist's gain cannot be told from 1, or the default carries at least
        as much. Without an interval (a launch carried nothing) the finalist wins only where it carried load in
        every launch and the default did not, with the higher median: where both carried nothing in some launch,
        the measurement cannot tell them apart."""
        if self.against_itself:
            return True
        gain = self.gain
        if gain is not None:
            return gain.includes_one or gain.ratio <= 1.0
        d, f = self.default.median, self.finalist.median
        return not self.finalist.carried_every_time or f is None or (d is not None and d >= f)

    @property
    def winner(self) -> ArmResult:
        """The arm to recommend: the finalist only when it is better beyond noise."""
        return self.default if self.keep_default else self.finalist

    def sentence(self) -> str:
        """The verdict in one sentence, with the interval and the repeats behind it."""
        gain, d, f = self.gain, self.default, self.finalist
        # Without an interval, some launch carried nothing: which, and why where it failed.
        why = "; ".join(a.nothing_carried() for a in (f, d) if not a.carried_every_time)
        if self.against_itself:
            if gain is None:
                return f"A/A check: vLLM's default against itself gave no interval ({why})"
            verdict = ("includes 1, as it must for identical configurations" if gain.includes_one else
                       "excludes 1: at this many repeats the measurement calls identical configurations different")
            return f"A/A check: vLLM's default against itself ({gain.text()}): the interval {verdict}"
        if gain is None:
            pick = "keep vLLM's default" if self.keep_default else f"{f.arm.label} is recommended"
            return f"no interval for {f.arm.label} against vLLM's default ({why}): {pick}"
        if not self.keep_default:
            return f"{f.arm.label} carries more than vLLM's default ({gain.text()}): recommended"
        if gain.ratio <= 1.0:
            return (f"vLLM's default carries at least as much as the best configuration found ({f.arm.label}: "
                    f"{gain.text()}): keep it")
        return f"vLLM's default is within noise of the best configuration found ({f.arm.label}: {gain.text()}): keep it"

    def verdict(self) -> str:
        """The sentence and, on a line of its own, how the launches ran where the runner said (`design`)."""
        return self.sentence() + (f"\n{self.design}" if self.design else "")

    def launches_text(self) -> str:
        """What each arm carried launch by launch and, after a load search, the lowest load above each that did not
        pass: `launch by launch, in req/s within the boundary, each with the lowest load above it that did not pass:
        vLLM's default 16.3 (23.1), 16.3 (23.1); trial 3 21 (23.1), 21 (23.1)`. It shows where the verdict's
        interval comes from when it is wider than the repeats' spread."""
        edges = ", each with the lowest load above it that did not pass" if any(
            b for a in self.arms for b in a.brackets) else ""
        arms = "; ".join(f"{a.arm.label} {a.launches_text()}" for a in self.arms)
        return f"launch by launch, in {self.unit}{edges}: {arms}"

    def to_dict(self) -> dict[str, Any]:
        """For programs: the arms, the order, the gain with its interval, and the verdict."""
        gain = self.gain
        return {"run": self.run, "repeats": self.repeats, "unit": self.unit, "complete": self.complete,
                "against_itself": self.against_itself, "paired": self.paired, "arms": [a.to_dict() for a in self.arms],
                "order": list(self.order), "gain": gain.to_dict() if gain else None,
                "keep_default": self.keep_default, "recommended": self.winner.arm.label,
                "sentence": self.sentence()}


def launch_value(trial: StoredTrial, searched: bool) -> float | None:
    """What one validation launch carried whole (`Score.carried_rps`): after a load search its capacity (0 when no
    load passed), at a fixed load its completed req/s when within the boundary (else 0), either times the share of
    requests its max_model_len left unclipped; 0 for a launch that failed; None for one that did not finish (stopped,
    lost: it is run again)."""
    if trial.state is TrialState.FAILED:
        return 0.0
    score = trial.scored
    if trial.state is not TrialState.COMPLETE or score is None:
        return None
    if searched:
        return score.carried_rps if score.capacity is not None else 0.0
    return score.carried_rps if score.feasible else 0.0


def launch_bracket(trial: StoredTrial) -> float:
    """How far above a searched launch's capacity its bracket reached (`Capacity.bracket`); 0 where it did not
    search."""
    capacity = trial.scored.capacity if trial.scored is not None else None
    return capacity.bracket if capacity is not None else 0.0


def validations(trials: Sequence[StoredTrial], searched: bool, resolution: float = 0.0) -> list[Validation]:
    """Every validation of a study, oldest first, judged from its marked trials; `resolution` as in
    `gain_interval`."""
    runs: dict[int, list[StoredTrial]] = {}
    for t in sorted(trials, key=lambda t: t.trial_number):
        if t.validation is not None:
            runs.setdefault(t.validation.run, []).append(t)
    return [_judge(run, marked, searched, resolution) for run, marked in sorted(runs.items())]


def latest_validation(trials: Sequence[StoredTrial], searched: bool, resolution: float = 0.0, *,
                      against_itself: bool = False) -> Validation | None:
    """The newest complete validation of the kind asked for (of finalists, or an A/A check); None when none."""
    done = [v for v in validations(trials, searched, resolution) if v.complete and v.against_itself == against_itself]
    return done[-1] if done else None


def _judge(run: int, marked: list[StoredTrial], searched: bool, resolution: float) -> Validation:
    arms: dict[int, Arm] = {}
    launches: dict[int, list[tuple[int, float, float, int]]] = {}
    failures: dict[int, list[str]] = {}
    order = []
    paired = []
    for t in marked:
        mark = t.validation
        assert mark is not None
        arms.setdefault(mark.arm, Arm(mark.arm, mark.of_trial))
        value = launch_value(t, searched)
        if value is None:
            continue
        order.append(t.trial_number)
        paired.append(mark.paired)
        launches.setdefault(mark.arm, []).append((t.trial_number, value, launch_bracket(t), mark.round))
        if t.state is TrialState.FAILED:
            failures.setdefault(mark.arm, []).append(t.failure_class or "failed")
    repeats = max(t.validation.repeats for t in marked if t.validation is not None)
    results = tuple(ArmResult(arm, tuple(n for n, _, _, _ in launches.get(i, [])),
                              tuple(v for _, v, _, _ in launches.get(i, [])), tuple(failures.get(i, [])),
                              tuple(b for _, _, b, _ in launches.get(i, [])),
                              tuple(r for _, _, _, r in launches.get(i, []))) for i, arm in sorted(arms.items()))
    # Rounds of a paired validation that fell back to interleaved launches part-way are no pairs: Welch's then.
    return Validation(run, repeats, results, tuple(order), _unit(searched), resolution, bool(paired) and all(paired))


def unstarted(run: int, repeats: int, arms: Sequence[Arm], searched: bool, resolution: float = 0.0) -> Validation:
    """A validation stopped before its first launch (no time left for one): planned, nothing measured."""
    return Validation(run, repeats, tuple(ArmResult(arm, (), ()) for arm in arms), (), _unit(searched), resolution)


def _unit(searched: bool) -> str:
    return "req/s within the boundary" if searched else "completed req/s within the boundary"
