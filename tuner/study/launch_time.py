"""How long a run's next launches will take, from the study's trials so far, and whether they fit the time the run
has: its deadline, its window's end, its budget and the share of it the validation keeps."""

from __future__ import annotations

import math
import statistics
import time

from tuner.analysis.capacity import SETTLED_FROM_START
from tuner.common.durations import format_duration
from tuner.common.hardware import detect_hardware
from tuner.storage import Repository, StoredTrial, StudySettings, TrialState
from tuner.study.budget import BudgetPlan, LaunchCost, RunBudget
from tuner.study.events import BUDGET_KEPT, BUDGET_SPENT
from tuner.study.open_study import OpenStudy, mark_of
from tuner.study.run_record import RunRecorder
from tuner.validation import Pairing, pairing
from tuner.workers.paired import expected_sleep_s, sleep_mode_served


def _like_the_next(repo: Repository, settings: StudySettings, validation: bool,
                   baselines: frozenset[int] | set[int] = frozenset()) -> list[StoredTrial]:
    """The trials the next one will likely take as long as: the study's trials of its kind that served (a
    validation launch searches with twice the probes, `LoadPolicy.for_launch`; a launch that failed fast says
    little); for a validation launch before any, the study's trials of vLLM's default (`baselines`), which searched
    their whole capacity as a validation launch does, where search trials stop at the best so far; before any, the
    study's others; before any, other studies' on the same model."""
    def served(name: str) -> list[StoredTrial]:
        return [t for t in repo.trials(name)
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.timings and t.timings.total_s]

    own = served(settings.name)
    same_kind = [t for t in own if (t.validation is not None) == validation]
    if validation and not same_kind:
        same_kind = [t for t in own if t.trial_number in baselines]
    return same_kind or own or [t for other in repo.list_studies() if other.name != settings.name
                                and other.model == settings.model for t in served(other.name)]


def _probing(trial: StoredTrial, validation: bool, search: bool) -> tuple[float, int]:
    """What `trial`'s probes (draining and teardown included) tell of the next launch's, in seconds and probes: for
    a validation launch judged by a trial that was none (vLLM's default's whole search), the seconds a probe took
    times the probes a launch that starts at its configuration's capacity takes (`SETTLED_FROM_START`); else its
    own. A paired engine's sleeps are left out: `LaunchCost.sleep_s` counts them."""
    assert trial.timings is not None
    took = trial.timings.replay_s + trial.timings.teardown_s - trial.timings.sleep_s
    if validation and trial.validation is None and search and trial.probes:
        return took / len(trial.probes) * SETTLED_FROM_START, SETTLED_FROM_START
    return took, max(1, len(trial.probes))


def launch_cost(repo: Repository, settings: StudySettings, trace_span_s: float, validation: bool,
                baselines: frozenset[int] | set[int] = frozenset(), sleep_s: float = 0.0) -> LaunchCost:
    """The next launch's expected startup and probes: medians over `_like_the_next` (`_probing`); before any
    trial, no startup and the trace's span, which no trial can take less than. `sleep_s`: a paired engine's sleep,
    kept unless a launch judged by ran paired before sleeps were stored apart (`TrialTimings.sleep_s`): its probing
    holds them."""
    found = _like_the_next(repo, settings, validation, baselines)
    if not found:
        return LaunchCost(0.0, trace_span_s, 1, sleep_s)
    probing = [_probing(t, validation, settings.load.mode == "search") for t in found]
    return LaunchCost(statistics.median(t.timings.startup_s for t in found if t.timings is not None),
                      statistics.median(seconds for seconds, _ in probing),
                      statistics.median(probes for _, probes in probing),
                      0.0 if any(t.validation is not None and t.validation.paired and t.timings is not None
                                 and not t.timings.sleep_s for t in found) else sleep_s)


def expected_trial_s(repo: Repository, settings: StudySettings, trace_span_s: float, validation: bool,
                     baselines: frozenset[int] | set[int] = frozenset()) -> float:
    """How long the next trial will likely take (`launch_cost`)."""
    return launch_cost(repo, settings, trace_span_s, validation, baselines).total_s


class RunClock:
    """Whether the next trial, a validation or the rest of a search fits the time a run has, judged on the slots
    it holds (`RunRecorder.slots`) by the study's trials so far."""

    def __init__(self, opened: OpenStudy, recorder: RunRecorder):
        self.opened, self.recorder = opened, recorder

    def no_time_for_a_trial(self, deadline: float | None, stop_at: float | None,
                            validation: bool | None = None) -> bool:
        """Whether the next trial started now would end after the deadline or stop_at, judged by the median time of
        the study's finished trials of its kind (`expected_trial_s`): a validation launch where `validation`, else
        whatever is queued first (a proposal when nothing is)."""
        ends = [t for t in (deadline, stop_at) if t is not None]
        if not ends:
            return False
        if validation is None:
            waiting = self.opened.waiting()
            validation = bool(waiting) and mark_of(waiting[0]) is not None
        expected_s = expected_trial_s(self.opened.repo, self.opened.settings, self.opened.ctx.trace.span_s,
                                      validation, self.opened.baselines() if validation else set())
        return time.time() + expected_s > min(ends)

    def budget_stop(self, budget: RunBudget) -> str | None:
        """Why the budget lets no trial start now: none would end before its end, or no search trial before the
        validation's share begins; None where one may start."""
        if self.no_time_for_a_trial(None, budget.end(self.recorder.slots)):
            return BUDGET_SPENT
        # The validation's share is kept only once it has a configuration to launch against vLLM's default: until
        # then the search may use it, since a validation without a candidate would not run at all.
        if self.searching() and self.a_candidate() and \
                self.no_time_for_a_trial(self.search_end(budget), None, validation=False):
            return BUDGET_KEPT
        return None

    def a_candidate(self) -> bool:
        """Whether the study has a configuration other than vLLM's default for a validation to launch."""
        return bool(self.opened.finalists(self.opened.trials(), 1))

    def searching(self) -> bool:
        """Whether the run's next trial is a search trial (no validation launch is queued first)."""
        waiting = self.opened.waiting()
        return not waiting or mark_of(waiting[0]) is None

    def launch_s(self) -> float:
        """The expected time of a validation launch (`launch_cost`)."""
        return self.launch_cost().total_s

    def launch_cost(self) -> LaunchCost:
        """A validation launch's expected startup and probes (`launch_cost`), and where it runs paired, its
        engine's sleeps, by the weights of vLLM's default (`expected_sleep_s`)."""
        opened = self.opened
        memory = opened.ctx.space_context.model_memory
        sleep_s = expected_sleep_s(memory.weight_bytes()) if memory is not None else 0.0
        return launch_cost(opened.repo, opened.settings, opened.ctx.trace.span_s, True, opened.baselines(), sleep_s)

    def validation_s(self, launches: int, arms: int, wanted: bool, held: bool = False) -> tuple[float, bool]:
        """The clock time a validation of `launches` launches of `arms` configurations is expected to take, and
        whether it would run paired (`pairs`): then each arm's engine starts once, or not at all where the search's
        opening pair `held` them."""
        paired = self.pairs(arms, wanted).paired
        return self.launch_cost().validation_s(launches, self.recorder.slots, arms if paired else 0,
                                               held and paired), paired

    def pairs(self, arms: int, wanted: bool) -> Pairing:
        """Whether a validation of `arms` configurations can run paired on this machine's GPUs and vLLM (`pairing`)."""
        tp = self.opened.ctx.space.baseline().tensor_parallel_size or 1
        return pairing(arms, detect_hardware().gpu_count // tp, sleep_mode_served(), wanted)

    def pairing(self, arms: int, launches: int, queued: int, wanted: bool, deadline: float | None,
                stop_at: float | None, held: bool = False) -> Pairing:
        """Whether a validation runs paired (`pairing`), decided before anything is launched: on this machine's
        GPUs and vLLM, with nothing else queued to run first, and where its launches, run as one job, end in time."""
        plan = self.pairs(arms, wanted)
        if plan.paired and queued:
            return Pairing(False, "trials queued before the validation run first")
        ends = [t for t in (deadline, stop_at) if t is not None]
        expected_s = self.launch_cost().validation_s(launches, 1, arms, held)
        if plan.paired and ends and time.time() + expected_s > min(ends):
            return Pairing(False, f"run paired, its {launches} launches are one job, which would not end in time "
                                  f"(about {format_duration(expected_s)})")
        return plan

    def budget_short(self, budget: RunBudget, launches: int, arms: int, held: bool = False) -> str | None:
        """Why the budget cannot hold `launches` validation launches of `arms` configurations from now (on the engines
        `held` from the search's opening pair); None where it can."""
        slots = self.recorder.slots
        end = budget.end(slots)
        needed, paired = self.validation_s(launches, arms, budget.pairing, held)
        if end is None or time.time() + needed <= end:
            return None
        left = max(0.0, end - time.time()) * slots
        how = ", paired," if paired else ""
        return (f"the budget left {format_duration(left)} of {self.recorder.unit()} time, and its {launches} "
                f"launches{how} of about {format_duration(self.launch_s())} need {format_duration(needed * slots)}")

    def search_end(self, budget: RunBudget) -> float | None:
        """When the search's trials must have ended under the budget, the validation's time kept."""
        return budget.search_end(self.recorder.slots, self.validation_s(budget.validation_launches,
                                                                        budget.validation_arms, budget.pairing)[0])

    def budget_plan(self, budget: RunBudget, n_trials: int | None) -> BudgetPlan:
        """The plan of a search under `budget` from now, on the slots held."""
        opened, slots = self.opened, self.recorder.slots
        end = budget.end(slots)
        assert end is not None
        trial_s = expected_trial_s(opened.repo, opened.settings, opened.ctx.trace.span_s, False)
        launch_s = self.launch_s()
        validation_s, paired = self.validation_s(budget.validation_launches, budget.validation_arms, budget.pairing)
        search_end = budget.search_end(slots, validation_s)
        assert search_end is not None
        fit = max(0, math.floor((search_end - time.time()) / trial_s)) * slots if trial_s > 0 else 0
        measured = sum(t.timings is not None for t in opened.trials())
        return BudgetPlan(self.recorder.unit(), slots, (end - budget.started_at) * slots, trial_s, launch_s,
                          fit if n_trials is None else min(fit, n_trials), budget.validation_launches,
                          search_end < end or not budget.validation_launches, measured,
                          opened.settings.load.probe_budget if opened.settings.load.mode == "search" else 1,
                          no_candidate=bool(budget.validation_launches) and measured > 0 and not self.a_candidate(),
                          validation_s=validation_s, paired=paired)
