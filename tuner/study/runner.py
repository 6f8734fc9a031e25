"""Running a stored study: its trials on Ray workers, `parallel` at a time, each scored, stored and told to
Optuna. The only module of tuner.study that imports Ray."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import ray
from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState
from sqlalchemy.exc import OperationalError

from tuner.bottleneck import measurement_attrs
from tuner.capacity import SETTLED_FROM_START, JudgedProbe, capacity_of
from tuner.diagnosis import LIMITING_RESOURCE_ATTR, EngineCaps, limiting_resource
from tuner.hardware import detect_hardware
from tuner.kv_budget import KvPrediction, estimate_kv, logged_kv_tokens
from tuner.kv_traffic import kv_traffic_bound, tpot_floor
from tuner.pruning import BoundaryWatch, VerdictWatch
from tuner.samplers import make_sampler
from tuner.scoring import Rejection, Score, score
from tuner.search_spaces import PREDICTED_KV_INSUFFICIENT
from tuner.durations import format_duration
from tuner.errors import TunerError
from tuner.storage import DatabaseUnreachable, Repository, StoredTrial, StudySettings, TrialState, ValidationMark
from tuner.storage.records import StoredRun
from tuner.storage.spend import Spend, slot_unit
from tuner.storage.artifacts import attach_trial_artifacts, trial_dir
from tuner.study.attrs import (BASELINE_ATTR, KV_LOGGED_ATTR, KV_PREDICTION_ATTR, ON_DEFAULT_ATTR, RERUN_ATTR,
                               RESUMED_ATTR, VALIDATION_ATTR)
from tuner.study.create import study_context
from tuner.study.budget import BudgetPlan, LaunchCost, RunBudget
from tuner.study.events import (BUDGET_END, BUDGET_KEPT, BUDGET_SPENT, NO_TIME_LEFT, WINDOW_END, BudgetPlanned,
                                PoolReady, RunEvent, RunReport, TrialDone, TrialStarted, TrialSummary, WorkerDone)
from tuner.study.plan import StoragePlan
from tuner.study.recommendation import candidates, finalists, validation_terms
from tuner.traces.records import Trace
from tuner.traces.selection import fit_trace
from tuner.validation import (PAIRED, Arm, Pairing, Validation, interleaved, paired_design, pairing, unstarted,
                              validations)
from tuner.workers.engine_config import EngineConfig
from tuner.workers.paired import PairedSpec, expected_sleep_s, sleep_mode_served
from tuner.workers.pool import WorkerLost, WorkerPool, WorkerResult
from tuner.workers.probe_log import PROBE_LOG, ProbeLog
from tuner.workers.trial import ARTIFACTS, TrialOutcome, TrialSpec

# Proposals rejected before launch cost no trial of a run's budget, up to this many in a row (a space whose
# rules reject almost everything must still end).
MAX_REJECTED_IN_A_ROW = 20
# How often a run with trials in flight looks at the clock and for a stop request.
STOP_POLL_S = 1.0


class _Heartbeat:
    """Proves the driver alive for one running trial, as study.optimize would (ask/tell has no heartbeat)."""

    def __init__(self, storage: RDBStorage, trial_id: int, interval_s: float):
        self._storage, self._trial_id, self._interval = storage, trial_id, interval_s
        self._stop = threading.Event()
        storage.record_heartbeat(trial_id)
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except StorageInternalError:
                # The database is out of reach for now: beat again next time. Whether the run can go on is
                # decided when the trial's result is stored.
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _stops_when_the_database_is_lost(run: Callable) -> Callable:
    """The database lost mid-run (Optuna's side or tuner's tables) ends the run with one line naming it, not a
    traceback. The trials in flight stay RUNNING without heartbeat, so the next run re-runs them; every stored
    trial is kept."""

    @functools.wraps(run)
    def guarded(self: StudyRunner, *args, **kwargs):
        try:
            return run(self, *args, **kwargs)
        except (DatabaseUnreachable, OperationalError, StorageInternalError) as exc:
            # Optuna wraps the driver's error in its own, whatever its cause.
            lost = exc.__cause__ if isinstance(exc, StorageInternalError) else exc
            if isinstance(lost, OperationalError):
                lost = DatabaseUnreachable.from_error(self.plan.url, lost)
            elif not isinstance(lost, DatabaseUnreachable):
                raise
            raise DatabaseUnreachable(f"{lost}; the run stopped, the trials in flight will be run again by the "
                                      f"next `tuner study run`") from None

    return guarded


def _attempt(study: optuna.Study, trial: optuna.Trial) -> int:
    """1 for a first run; a configuration re-run after its driver died counts its earlier tries."""
    return len(RetryHeartbeatStaleTrialCallback.retry_history(study.get_trials(deepcopy=False)[trial.number])) + 1


def _rerun_of(study: optuna.Study, trial: optuna.Trial) -> int | None:
    """The trial this one runs again, cut off before it finished: the last of Optuna's retries (its driver stopped),
    else the one a lost worker or a stopped run left (RERUN_ATTR); None for a first run."""
    history = RetryHeartbeatStaleTrialCallback.retry_history(study.get_trials(deepcopy=False)[trial.number])
    return history[-1] if history else trial.user_attrs.get(RERUN_ATTR)


def _best_capacity(trials: list[StoredTrial]) -> tuple[float | None, float | None]:
    """The highest capacity among the candidate search trials (`candidates`; the feasible ones, as a search that
    starts from it runs only once one carried your traffic): (against the reference load, req/s)."""
    found = [(t.scored.capacity.factor, t.scored.capacity.rps) for t in candidates(trials)
             if t.scored.capacity is not None and t.scored.capacity.factor is not None]
    return max(found, default=(None, None))


def _kept(trial: optuna.Trial | FrozenTrial) -> dict[str, Any]:
    """What a launch of `trial`'s configuration again (a validation launch, a re-run) keeps of its user attributes:
    which settings it changes from vLLM's default, where it changes only those."""
    return {k: trial.user_attrs[k] for k in (ON_DEFAULT_ATTR,) if k in trial.user_attrs}


def _mark(trial: optuna.Trial | FrozenTrial) -> ValidationMark | None:
    """The validation mark of a validation launch; None for a search trial."""
    data = trial.user_attrs.get(VALIDATION_ATTR)
    return ValidationMark.from_dict(data) if data else None


class NothingToValidate(TunerError):
    """A study with no feasible configuration other than vLLM's default: there is no finalist to launch again."""


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
    own."""
    assert trial.timings is not None
    took = trial.timings.replay_s + trial.timings.teardown_s
    if validation and trial.validation is None and search and trial.probes:
        return took / len(trial.probes) * SETTLED_FROM_START, SETTLED_FROM_START
    return took, max(1, len(trial.probes))


def _launch_cost(repo: Repository, settings: StudySettings, trace_span_s: float, validation: bool,
                 baselines: frozenset[int] | set[int] = frozenset(), sleep_s: float = 0.0) -> LaunchCost:
    """The next launch's expected startup and probes: medians over `_like_the_next` (`_probing`); before any
    trial, no startup and the trace's span, which no trial can take less than. `sleep_s`: a paired engine's sleep,
    kept where no launch judged by ran paired (theirs hold their sleeps)."""
    found = _like_the_next(repo, settings, validation, baselines)
    if not found:
        return LaunchCost(0.0, trace_span_s, 1, sleep_s)
    probing = [_probing(t, validation, settings.load.mode == "search") for t in found]
    return LaunchCost(statistics.median(t.timings.startup_s for t in found if t.timings is not None),
                      statistics.median(seconds for seconds, _ in probing),
                      statistics.median(probes for _, probes in probing),
                      0.0 if any(t.validation is not None and t.validation.paired for t in found) else sleep_s)


def _expected_trial_s(repo: Repository, settings: StudySettings, trace_span_s: float, validation: bool,
                      baselines: frozenset[int] | set[int] = frozenset()) -> float:
    """How long the next trial will likely take (`_launch_cost`)."""
    return _launch_cost(repo, settings, trace_span_s, validation, baselines).total_s


@dataclass
class _InFlight:
    trial: optuna.Trial
    config: EngineConfig
    baseline: bool
    trace: Trace
    slot: int
    beat: _Heartbeat
    started_at: str  # ISO 8601, UTC
    # The best capacity so far when it started, (against the reference load, req/s): its search tries that first.
    best_capacity: tuple[float | None, float | None] = (None, None)
    slot_freed_at: float | None = None  # when the trial before it on this slot ended (time.time())


class StudyRunner:
    """Runs a stored study's trials on Ray workers, `parallel` at a time: ask, launch and measure on a slot,
    score, store, tell, and ask again as soon as a slot frees."""

    def __init__(self, name: str, plan: StoragePlan, *, prune: bool = True, parallel: int | None = None,
                 ray_address: str | None = None, on_event: Callable[[RunEvent], None] | None = None):
        self.plan = plan
        self.repo = plan.repository()
        self.settings = self.repo.get_study(name)
        self.ctx = study_context(self.settings)
        self.storage = plan.optuna_storage()
        self.study = optuna.load_study(study_name=name, storage=self.storage)
        self.study.sampler = make_sampler(self.settings.sampler, self.settings.seed)
        self.prune = prune
        self.parallel = parallel
        self.ray_address = ray_address
        self._emit = on_event or (lambda event: None)
        self._stop_reason: str | None = None
        # This runner's run as stored (its search and its validation are one run), and the slots it holds.
        self._run: StoredRun | None = None
        self._slots = parallel or 1

    def stop(self, reason: str) -> None:
        """End the run from outside (another thread, a signal handler): no trial starts any more, the trials in
        flight are stopped and recorded as stopped with this reason, and `run` returns."""
        self._stop_reason = self._stop_reason or reason

    @_stops_when_the_database_is_lost
    def run(self, n_trials: int | None, deadline: float | None = None, *,
            stop_at: float | None = None, budget: RunBudget | None = None) -> RunReport:
        """Up to n_trials trials (None: as many as time allows). None is started that the deadline, stop_at
        (time.time()) or the budget would cut short, judged by the median time of the study's finished trials; at
        stop_at, or at the budget's end, the trials still in flight are stopped. A search under a budget keeps the
        time its validation needs (`RunBudget.search_end`)."""
        report = RunReport()
        # Judged before Ray starts too: a run with no time for a trial costs no cluster, and its verdict does not
        # depend on how long a cluster takes to start.
        if n_trials != 0 and self._no_time_for_a_trial(deadline, stop_at):
            report.stopped_early = NO_TIME_LEFT
            return report
        tp = self.ctx.space.baseline().tensor_parallel_size or 1
        hardware = detect_hardware()
        started = time.time() if budget is None else budget.started_at
        with WorkerPool(self.parallel, ray_address=self.ray_address, tensor_parallel_size=tp,
                        local_gpus=hardware.gpu_count) as pool:
            self._slots = len(pool.slots)
            self._record_run(started, pool.slots[0].gpus, budget)
            self._emit(PoolReady(len(pool.slots), pool))
            # A search under a budget says its plan, once more when its first trial's time is known; a validation
            # (launches queued first) has none to say.
            planned = budget is None or n_trials == 0 or not self._searching()
            at_end = WINDOW_END
            if budget is not None:
                budget_end = budget.end(self._slots)
                if budget_end is not None and (stop_at is None or budget_end < stop_at):
                    stop_at, at_end = budget_end, BUDGET_END
                if not planned:
                    report.plan = self._budget_plan(budget, n_trials)
                    self._emit(BudgetPlanned(report.plan))
                    planned = report.plan.measured > 0
            free = [slot.index for slot in pool.slots]
            freed_at: dict[int, float] = {}
            in_flight: dict[ray.ObjectRef, _InFlight] = {}
            begun = rejected = 0
            try:
                while True:
                    reason = self._stop_reason or (at_end if stop_at is not None and time.time() >= stop_at
                                                   else None)
                    if reason is not None:
                        report.stopped_early = reason
                        self._stop_in_flight(pool, in_flight, reason, report)
                        break
                    while free and (n_trials is None or begun < n_trials) and report.stopped_early is None:
                        if budget is not None and (short := self._budget_stop(budget)) is not None:
                            report.stopped_early = short
                            break
                        if self._no_time_for_a_trial(deadline, stop_at):
                            report.stopped_early = NO_TIME_LEFT
                            break
                        begun += 1
                        # Trials of a driver that died (before this run or during it) are failed now and
                        # re-enqueued once with the same configuration, so the next ask runs them again.
                        fail_stale_trials(self.study)
                        self._record_interrupted()
                        job = self._start(pool, free[0])
                        if isinstance(job, TrialSummary):  # rejected before launch: the slot stays free
                            report.trials.append(job)
                            rejected += 1
                            if rejected <= MAX_REJECTED_IN_A_ROW:
                                begun -= 1  # costs no trial of the budget, as long as proposals keep coming
                            continue
                        rejected = 0
                        job[0].slot_freed_at = freed_at.get(free[0])
                        in_flight[pool.submit(free.pop(0), job[1])] = job[0]
                    if not in_flight:
                        break
                    ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=STOP_POLL_S)
                    if not ready:
                        continue
                    ref = ready[0]
                    job = in_flight.pop(ref)
                    freed_at[job.slot] = time.time()
                    try:
                        result: WorkerResult = ray.get(ref)
                    except WorkerLost as exc:
                        report.trials.append(self._lost(job, exc))
                        pool.replace_worker(job.slot)
                        begun -= 1  # the re-run of a lost trial does not use up the budget
                    else:
                        # Scheduling overhead: from the slot freeing to the launch of this trial's engine.
                        launched, freed = result.outcome.launched_at, job.slot_freed_at
                        waited = None if launched is None or freed is None else launched - freed
                        self._emit(WorkerDone(job.trial.number, job.slot, result.node, waited))
                        report.trials.append(self._finish(job, result))
                        if budget is not None and not planned:
                            # The first trial's time replaces the trace's span as the plan's estimate.
                            report.plan = self._budget_plan(budget, n_trials and n_trials - begun)
                            self._emit(BudgetPlanned(report.plan))
                            planned = True
                    finally:
                        job.beat.stop()
                        self._record_run(trial=job.trial.number)
                    free.append(job.slot)
            finally:
                # Ctrl-C or any error: the pool's shutdown kills every worker and so every engine. The trials
                # in flight stay RUNNING without heartbeat, so the next driver re-runs them.
                for job in in_flight.values():
                    job.beat.stop()
        self._record_run()
        report.spent = self.spent()
        return report

    def _record_run(self, started_at: float | None = None, gpus_per_slot: int = 0, budget: RunBudget | None = None,
                    trial: int | None = None) -> None:
        """Store this runner's run: begun (`started_at`) when its first pool is up, then its end moved on and its
        trials added as they end, so that a run that dies keeps what it held until its last trial."""
        now = time.time()
        if self._run is None:
            if started_at is None:
                return
            self._run = StoredRun(self.settings.name, started_at, now, self._slots, gpus_per_slot,
                                  budget_s=budget.budget_s if budget else None)
        trials = self._run.trials + ((trial,) if trial is not None and trial not in self._run.trials else ())
        self._run = self.repo.save_run(dataclasses.replace(self._run, ended_at=now, trials=trials,
                                                           slots=max(self._run.slots, self._slots)))

    def spent(self) -> Spend | None:
        """What this runner's run has spent so far (None before its pool was up)."""
        if self._run is None:
            return None
        mine = [t for t in self.repo.trials(self.settings.name) if t.trial_number in self._run.trials]
        return Spend.of(mine, [self._run])

    def _budget_stop(self, budget: RunBudget) -> str | None:
        """Why the budget lets no trial start now: none would end before its end, or no search trial before the
        validation's share begins; None where one may start."""
        if self._no_time_for_a_trial(None, budget.end(self._slots)):
            return BUDGET_SPENT
        # The validation's share is kept only once it has a configuration to launch against vLLM's default: until
        # then the search may use it, since a validation without a candidate would not run at all.
        if self._searching() and self._a_candidate() and \
                self._no_time_for_a_trial(self._search_end(budget), None, validation=False):
            return BUDGET_KEPT
        return None

    def _a_candidate(self) -> bool:
        """Whether the study has a configuration other than vLLM's default for a validation to launch."""
        return bool(self._finalists(self.repo.trials(self.settings.name), 1))

    def _unit(self) -> str:
        """What one of this run's slot-seconds is (`slot_unit`)."""
        return slot_unit(self._run.gpus_per_slot if self._run else 0)

    def _searching(self) -> bool:
        """Whether the run's next trial is a search trial (no validation launch is queued first)."""
        waiting = self.study.get_trials(deepcopy=False, states=(OptunaState.WAITING,))
        return not waiting or _mark(waiting[0]) is None

    def _launch_s(self) -> float:
        """The expected time of a validation launch (`_launch_cost`)."""
        return self._launch_cost().total_s

    def _launch_cost(self) -> LaunchCost:
        """A validation launch's expected startup and probes (`_launch_cost`), and where it runs paired, its
        engine's sleeps, by the weights of vLLM's default (`expected_sleep_s`)."""
        memory = self.ctx.space_context.model_memory
        sleep_s = expected_sleep_s(memory.weight_bytes()) if memory is not None else 0.0
        return _launch_cost(self.repo, self.settings, self.ctx.trace.span_s, True, self._baselines(), sleep_s)

    def _validation_s(self, launches: int, arms: int, wanted: bool) -> tuple[float, bool]:
        """The clock time a validation of `launches` launches of `arms` configurations is expected to take, and
        whether it would run paired (`_pairs`): then each arm's engine starts once."""
        paired = self._pairs(arms, wanted).paired
        return self._launch_cost().validation_s(launches, self._slots, arms if paired else 0), paired

    def _pairs(self, arms: int, wanted: bool) -> Pairing:
        """Whether a validation of `arms` configurations can run paired on this machine's GPUs and vLLM (`pairing`)."""
        tp = self.ctx.space.baseline().tensor_parallel_size or 1
        return pairing(arms, detect_hardware().gpu_count // tp, sleep_mode_served(), wanted)

    def _budget_short(self, budget: RunBudget, launches: int, arms: int) -> str | None:
        """Why the budget cannot hold `launches` validation launches of `arms` configurations from now; None where it
        can."""
        end = budget.end(self._slots)
        needed, paired = self._validation_s(launches, arms, budget.pairing)
        if end is None or time.time() + needed <= end:
            return None
        left = max(0.0, end - time.time()) * self._slots
        how = ", paired," if paired else ""
        return (f"the budget left {format_duration(left)} of {self._unit()} time, and its {launches} launches{how} of "
                f"about {format_duration(self._launch_s())} need {format_duration(needed * self._slots)}")

    def _search_end(self, budget: RunBudget) -> float | None:
        """When the search's trials must have ended under the budget, the validation's time kept."""
        return budget.search_end(self._slots, self._validation_s(budget.validation_launches, budget.validation_arms,
                                                                 budget.pairing)[0])

    def _budget_plan(self, budget: RunBudget, n_trials: int | None) -> BudgetPlan:
        """The plan of a search under `budget` from now, on the slots held."""
        slots = self._slots
        end = budget.end(slots)
        assert end is not None
        trial_s = _expected_trial_s(self.repo, self.settings, self.ctx.trace.span_s, False)
        launch_s = self._launch_s()
        validation_s, paired = self._validation_s(budget.validation_launches, budget.validation_arms, budget.pairing)
        search_end = budget.search_end(slots, validation_s)
        assert search_end is not None
        fit = max(0, math.floor((search_end - time.time()) / trial_s)) * slots if trial_s > 0 else 0
        measured = sum(t.timings is not None for t in self.repo.trials(self.settings.name))
        return BudgetPlan(self._unit(), slots, (end - budget.started_at) * slots, trial_s, launch_s,
                          fit if n_trials is None else min(fit, n_trials), budget.validation_launches,
                          search_end < end or not budget.validation_launches, measured,
                          self.settings.load.probe_budget if self.settings.load.mode == "search" else 1,
                          no_candidate=bool(budget.validation_launches) and measured > 0 and not self._a_candidate(),
                          validation_s=validation_s, paired=paired)

    @_stops_when_the_database_is_lost
    def validate(self, top: int, repeats: int, *, against_itself: bool = False, deadline: float | None = None,
                 stop_at: float | None = None, budget: RunBudget | None = None,
                 paired: bool = True) -> tuple[Validation, RunReport]:
        """Launch vLLM's default configuration and the `top` best candidate search trials' configurations (or, with
        `against_itself`, the default twice: an A/A check) `repeats` times each, round by round, each launch a
        trial marked as a validation launch; then judge them. Raises NothingToValidate when no configuration
        other than the default is a candidate (`candidates`). `deadline` and `stop_at` bound it as they bound `run`;
        under a budget, a validation whose launches cannot all end before the budget's end is not begun. Where the
        platform offers it (`pairing`) and `paired` allows, the rounds run paired on one GPU instead
        (`_validate_paired`); the verdict says how the launches ran (`Validation.design`)."""
        trials = self.repo.trials(self.settings.name)
        arms = [Arm(0, None)]
        if against_itself:
            arms.append(Arm(1, None))
        else:
            arms += [Arm(i, number) for i, number in enumerate(self._finalists(trials, top), start=1)]
            if len(arms) == 1:
                raise NothingToValidate(f"study {self.settings.name} has no feasible configuration other than "
                                        f"vLLM's default to validate, nor, when none is feasible, one that carried "
                                        f"some load within the boundary: keep the default")
        run = max((t.validation.run for t in trials if t.validation is not None), default=0) + 1
        terms = validation_terms(self.settings)
        if self._no_time_for_a_trial(deadline, stop_at, validation=True):  # nothing queued for one that cannot start
            return unstarted(run, repeats, arms, *terms), RunReport(stopped_early=NO_TIME_LEFT)
        if budget is not None and (short := self._budget_short(dataclasses.replace(budget, pairing=paired),
                                                                len(arms) * repeats, len(arms))) is not None:
            return unstarted(run, repeats, arms, *terms), RunReport(stopped_early=short, spent=self.spent())
        frozen = self.study.get_trials(deepcopy=False)
        # Configurations queued before (the baseline of a study not run yet, say) are asked first: they run too.
        queued = sum(t.state is OptunaState.WAITING for t in frozen)
        marks = interleaved(arms, repeats, run)
        for mark in marks:
            self._queue_launch(mark, None if mark.of_trial is None else frozen[mark.of_trial])
        plan = self._pairing(len(arms), len(marks), queued, paired, deadline, stop_at)
        design = plan.text
        if plan.paired:
            # The paired job is stopped at the window's end or the budget's, as `run` stops its trials.
            ends = [t for t in (stop_at, budget.end(self._slots) if budget is not None else None) if t is not None]
            report, design = self._validate_paired(min(ends, default=None))
            # Launches that could not run paired were queued again: they run as interleaved launches.
            left = len(self.study.get_trials(deepcopy=False, states=(OptunaState.WAITING,)))
            if left and report.stopped_early is None:
                rest = self.run(left, deadline, stop_at=stop_at, budget=budget)
                report = dataclasses.replace(rest, trials=report.trials + rest.trials)
        else:
            report = self.run(queued + len(marks), deadline, stop_at=stop_at, budget=budget)
        judged = [v for v in validations(self.repo.trials(self.settings.name), *terms) if v.run == run]
        return (dataclasses.replace(judged[0], design=design) if judged
                else unstarted(run, repeats, arms, *terms)), report

    def _queue_launch(self, mark: ValidationMark, of: FrozenTrial | None) -> None:
        """Queue one validation launch of search trial `of`'s configuration (vLLM's default where None)."""
        self.study.enqueue_trial({} if of is None else dict(of.params),
                                 user_attrs={VALIDATION_ATTR: mark.to_dict(), **({} if of is None else _kept(of))},
                                 skip_if_exists=False)

    def _pairing(self, arms: int, launches: int, queued: int, wanted: bool, deadline: float | None,
                 stop_at: float | None) -> Pairing:
        """Whether this validation runs paired (`pairing`), decided before anything is launched: on this machine's
        GPUs and vLLM, with nothing else queued to run first, and where its launches, run as one job, end in time."""
        plan = self._pairs(arms, wanted)
        if plan.paired and queued:
            return Pairing(False, "trials queued before the validation run first")
        ends = [t for t in (deadline, stop_at) if t is not None]
        expected_s = self._launch_cost().validation_s(launches, 1, arms)
        if plan.paired and ends and time.time() + expected_s > min(ends):
            return Pairing(False, f"run paired, its {launches} launches are one job, which would not end in time "
                                  f"(about {format_duration(expected_s)})")
        return plan

    def _validate_paired(self, stop_at: float | None) -> tuple[RunReport, str]:
        """Run the queued validation launches paired on one GPU slot: one job (`WorkerPool.run_paired`) launches one
        engine per arm with sleep mode and probes the arms in turn, round by round; each arm's round is then
        concluded as its launch would be, marked paired. Launches that could not run paired (a refusal, a stop, a
        lost worker) are recorded as not run and queued again. Returns the report and how the launches ran."""
        report = RunReport()
        tp = self.ctx.space.baseline().tensor_parallel_size or 1
        with WorkerPool(1, ray_address=self.ray_address, tensor_parallel_size=tp,
                        local_gpus=detect_hardware().gpu_count) as pool:
            slot = pool.slots[0]
            self._record_run(time.time(), slot.gpus)
            self._emit(PoolReady(1, pool))
            if not slot.gpus:  # a Ray cluster elsewhere, without the GPU this machine has
                return report, Pairing(False, "the Ray cluster's slots have no GPU").text
            jobs: dict[tuple[int, int], tuple[_InFlight, TrialSpec]] = {}  # by (round, arm)
            refused = []  # before launch, and recorded so
            for _ in self.study.get_trials(deepcopy=False, states=(OptunaState.WAITING,)):
                started = self._start(pool, slot.index)
                if isinstance(started, TrialSummary):
                    refused.append(started)
                    continue
                mark = _mark(started[0].trial)
                assert mark is not None
                jobs[mark.round, mark.arm] = started
            report.trials += refused
            rounds, arms = sorted({r for r, _ in jobs}), sorted({a for _, a in jobs})
            done: list[tuple[_InFlight, WorkerResult]] = []
            try:
                if refused:
                    fallback: str | None = "a configuration was refused before launch"
                else:
                    spec = PairedSpec(tuple(tuple(jobs[r, a][1] for a in arms) for r in rounds))
                    result = pool.run_paired(slot.index, spec, lambda: self._stop_reason or (
                        WINDOW_END if stop_at is not None and time.time() >= stop_at else None), STOP_POLL_S)
                    if isinstance(result, str):
                        report.stopped_early = fallback = result
                    else:
                        fallback = result.fallback
                        done = [(jobs.pop((r, a))[0], arm_result) for r, round_results in zip(rounds, result.rounds)
                                for a, arm_result in zip(arms, round_results)]
            except WorkerLost as exc:
                report.trials += [self._lost(job, exc) for job, _ in jobs.values()]
                return report, (f"interleaved launches: the worker of the paired validation was lost "
                                f"({exc.__class__.__name__})")
            finally:
                for job, _ in jobs.values():
                    job.beat.stop()
            for job, arm_result in done:
                job.beat.stop()
                mark = _mark(job.trial)
                assert mark is not None
                job.trial.set_user_attr(VALIDATION_ATTR, dataclasses.replace(mark, paired=True).to_dict())
                report.trials.append(self._finish(job, arm_result))
                self._record_run(trial=job.trial.number)
            for job, _ in jobs.values():
                why = report.stopped_early or f"not run paired: {fallback}"
                report.trials.append(self._not_finished(job, TrialState.STOPPED, why))
        report.spent = self.spent()
        if report.stopped_early is not None:
            return report, PAIRED
        return report, paired_design(len(done) // max(len(arms), 1), len(rounds), fallback)

    def _no_time_for_a_trial(self, deadline: float | None, stop_at: float | None,
                             validation: bool | None = None) -> bool:
        """Whether the next trial started now would end after the deadline or stop_at, judged by the median time of
        the study's finished trials of its kind (`_expected_trial_s`): a validation launch where `validation`, else
        whatever is queued first (a proposal when nothing is)."""
        ends = [t for t in (deadline, stop_at) if t is not None]
        if not ends:
            return False
        if validation is None:
            waiting = self.study.get_trials(deepcopy=False, states=(OptunaState.WAITING,))
            validation = bool(waiting) and _mark(waiting[0]) is not None
        expected_s = _expected_trial_s(self.repo, self.settings, self.ctx.trace.span_s, validation,
                                       self._baselines() if validation else set())
        return time.time() + expected_s > min(ends)

    def _baselines(self) -> set[int]:
        """The numbers of the study's trials of vLLM's default configuration queued as its baseline."""
        return {t.number for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR)}

    def _finalists(self, trials: list[StoredTrial], top: int) -> list[int]:
        """`finalists` of the study's trials: none of them vLLM's default."""
        return finalists(trials, top, self.ctx.space.baseline(), self._baselines())

    def _stop_in_flight(self, pool: WorkerPool, in_flight: dict[ray.ObjectRef, _InFlight], reason: str,
                        report: RunReport) -> None:
        """Kill the workers of the trials in flight (each engine dies with its worker), then record each trial:
        as it ended if it had just finished, else as stopped."""
        for job in in_flight.values():
            pool.kill_worker(job.slot)
        for ref, job in list(in_flight.items()):
            try:
                report.trials.append(self._finish(job, ray.get(ref)))
            except WorkerLost:
                pool.bring_back_files(job.slot)
                job.trial.set_user_attr("stop_reason", reason)
                report.trials.append(self._not_finished(job, TrialState.STOPPED, reason))
            finally:
                job.beat.stop()
                del in_flight[ref]

    def _config(self, trial: optuna.Trial) -> tuple[EngineConfig, bool]:
        mark = _mark(trial)
        baseline = bool(trial.user_attrs.get(BASELINE_ATTR)) or (mark is not None and mark.default)
        return (self.ctx.space.baseline() if baseline
                else self.ctx.space.suggest(trial, only=trial.user_attrs.get(ON_DEFAULT_ATTR))), baseline

    def _start(self, pool: WorkerPool, slot: int) -> tuple[_InFlight, TrialSpec] | TrialSummary:
        trial = self.study.ask()
        config, baseline = self._config(trial)
        number = trial.number
        trial.set_user_attr("engine_config", config.to_dict())
        trial.set_user_attr("serve_command", config.serve_command(self.settings.model))
        self._emit(TrialStarted(number, baseline, config, slot, time.time()))
        violations = self.ctx.space.violations(config, self.ctx.space_context)
        if violations:
            return self._infeasible(trial, config, baseline, violations)
        max_model_len = config.max_model_len or self.ctx.space_context.model_max_len
        self._record_prediction(trial, config, max_model_len)
        trace = fit_trace(self.ctx.trace, self.ctx.selection, max_model_len)
        # The baseline and every validation launch run to the end and search their whole capacity (below your
        # traffic too, never cut short by the best so far): gains are measured against them and between them.
        # While no configuration carries your traffic, every trial searches its whole capacity below it too
        # (unpruned: its first probe is expected to fail), to find which carries the most of it.
        trials = self.repo.trials(self.settings.name)
        mark = _mark(trial)
        whole = baseline or mark is not None or not self._carried_yet(trials)
        best = (None, None) if whole else _best_capacity(trials)
        # A search trial that cannot carry the best so far's traffic by its KV cache is not launched.
        if not baseline and mark is None and (short := self._short_of_best(config, trace, trials)) is not None:
            return self._infeasible(trial, config, baseline, [short])
        # A validation launch starts its search where its configuration's capacity was found: most settle their
        # bracket in two probes after the reference, instead of climbing to it again.
        start = self._earlier_capacity(trials, mark) if mark is not None else None
        # A re-run of a trial cut off goes on after the probes that one finished.
        rerun_of = _rerun_of(self.study, trial)
        resume = None if rerun_of is None else self._probe_log(rerun_of).read(rerun_of, config)
        spec = TrialSpec(Path(self.settings.model), trace, config, self._trial_dir(number),
                         startup_timeout_s=self.settings.startup_timeout_s,
                         request_timeout_s=self.settings.request_timeout_s,
                         stop_rule=BoundaryWatch(self.ctx.boundary) if self.prune and not whole else None,
                         # Every probe of a search, the baseline's and validation's too, ends once its verdict is
                         # a certain failure: an overloaded probe does not wait for every request.
                         verdict_rule=VerdictWatch(self.ctx.boundary) if self.settings.load.mode == "search" else None,
                         load=self.settings.load.for_launch(mark is not None).plan(
                             self.ctx.boundary, best_factor=best[0], below_reference=whole, start_factor=start),
                         resume=resume)
        # If this driver dies, the heartbeats stop and the next driver re-runs this configuration.
        beat = _Heartbeat(self.storage, trial._trial_id, self.plan.heartbeat_interval_s)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return _InFlight(trial, config, baseline, trace, slot, beat, started_at, best), spec

    def _earlier_capacity(self, trials: list[StoredTrial], mark: ValidationMark) -> float | None:
        """The capacity (against the reference load) that a validation arm's configuration showed in the search:
        the trial it validates, or for vLLM's default the study's baseline trial. None where it carried none."""
        source = mark.of_trial if mark.of_trial is not None else min(self._baselines(), default=None)
        found = next((t for t in trials if t.trial_number == source), None)
        capacity = found.scored.capacity if found is not None and found.scored is not None else None
        return capacity.factor if capacity is not None else None

    def _short_of_best(self, config: EngineConfig, trace: Trace, trials: list[StoredTrial]) -> str | None:
        """Why `config`'s KV cache cannot carry the traffic the best search trial so far carries whole
        (`tuner.kv_traffic`); None where it might, or where nothing measured yet bounds it."""
        best = max((t.scored.carried_rps for t in candidates(trials)
                    if t.scored is not None and t.scored.capacity is not None), default=None)
        model, device = self.ctx.space_context.model_memory, self.ctx.space_context.device
        if best is None or model is None or device is None:
            return None
        measured = [(t.engine_config, m) for t in trials
                    for m in (t.measurement, *(j.probe.measurement for j in t.probes)) if m is not None]
        floor = tpot_floor(measured, config)
        bound = None if floor is None else kv_traffic_bound(estimate_kv(model, device, config), trace, floor, config)
        return bound.reason(best) if bound is not None and bound.rps < best else None

    def _carried_yet(self, trials: list[StoredTrial]) -> bool:
        """Whether some search trial carried your traffic within the boundary, or none was scored yet (the first
        trials search as if one had). False only in a load search where every scored trial broke the boundary
        at your traffic."""
        if self.settings.load.mode != "search":
            return True
        scored = [t for t in trials if t.scored is not None and t.validation is None]
        return not scored or any(t.feasible for t in scored)

    def _record_prediction(self, trial: optuna.Trial, config: EngineConfig, max_model_len: int) -> None:
        """The KV cache expected of a configuration that is launched (near the margin or not), so that the real
        outcome is recorded beside it."""
        space_context = self.ctx.space_context
        if space_context.model_memory is None or space_context.device is None:
            return
        estimate = estimate_kv(space_context.model_memory, space_context.device, config)
        trial.set_user_attr(KV_PREDICTION_ATTR,
                            KvPrediction(estimate, max_model_len, estimate.fit(max_model_len)).to_dict())

    def _trial_dir(self, number: int) -> Path:
        return trial_dir(self.plan.artifact_dir, self.settings.name, number)

    def _probe_log(self, number: int) -> ProbeLog:
        return ProbeLog(self._trial_dir(number) / PROBE_LOG)

    def _finish(self, job: _InFlight, result: WorkerResult) -> TrialSummary:
        """Bring the worker's files into the driver's artifact store, then score, store and tell."""
        out_dir = self._trial_dir(job.trial.number)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in result.files.items():
            (out_dir / name).write_bytes(data)
        record = dataclasses.replace(result.outcome.record, log_path=str(out_dir / "server.log"))
        outcome = dataclasses.replace(result.outcome, record=record)
        attach_trial_artifacts(self.study, job.trial, [out_dir / name for name in ARTIFACTS], self.plan.artifact_dir)
        return self._conclude(job.trial, job.config, job.baseline, outcome, job.trace, job.best_capacity)

    def _not_measured(self, trial: optuna.Trial | FrozenTrial, config: EngineConfig, state: TrialState,
                      rejection: Rejection | None = None, failure_class: str | None = None,
                      message: str | None = None, started_at: str | None = None) -> None:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.repo.save_trial(StoredTrial(
            study_name=self.settings.name, trial_number=trial.number, attempt=_attempt(self.study, trial),
            state=state, engine_config=config, serve_command=config.serve_command(self.settings.model),
            measurement=None, failure_class=failure_class, failure_message=message, log_excerpt=None,
            estimated_max_model_len=None, exit_code=None, timings=None, hardware=detect_hardware(),
            vllm_version="", started_at=started_at or now, finished_at=now, score=rejection, prune_reason=None,
            validation=_mark(trial)), [])

    def _record_interrupted(self) -> None:
        """Trials whose driver died mid-trial (failed by their stale heartbeat) into the project's tables, so that
        export and reports hold every trial; their configurations run again from the queue."""
        recorded = {t.trial_number for t in self.repo.trials(self.settings.name)}
        for frozen in self.study.get_trials(deepcopy=False, states=(OptunaState.FAIL,)):
            if frozen.number in recorded or "engine_config" not in frozen.user_attrs:
                continue
            config = EngineConfig.from_dict(frozen.user_attrs["engine_config"])
            self._not_measured(frozen, config, TrialState.INTERRUPTED, message="its driver stopped before the "
                               "trial finished (no heartbeat); the configuration is run again")

    def _lost(self, job: _InFlight, exc: Exception) -> TrialSummary:
        """The worker (or its node) died mid-trial: not the configuration's fault, so it is run once more."""
        job.trial.set_user_attr("failure_class", "worker_lost")
        return self._not_finished(job, TrialState.WORKER_LOST, f"the worker running this trial was lost: "
                                                               f"{exc.__class__.__name__}", "worker_lost")

    def _not_finished(self, job: _InFlight, state: TrialState, message: str,
                      failure_class: str | None = None) -> TrialSummary:
        """Ended by something other than its configuration (a lost worker, a stopped run): nothing measured,
        failed for Optuna (no sampler learns from it), and its configuration queued to run once more, first; a
        re-run is queued again only if it finished probes of its own, which the next goes on after."""
        trial = job.trial
        self._not_measured(trial, job.config, state, failure_class=failure_class, message=message,
                           started_at=job.started_at)
        self.study.tell(trial, state=OptunaState.FAIL)
        if self._probe_log(trial.number).runs_again(rerun=_rerun_of(self.study, trial) is not None):
            attrs = {RERUN_ATTR: trial.number, **_kept(trial),
                     **{k: trial.user_attrs[k] for k in (BASELINE_ATTR, VALIDATION_ATTR) if k in trial.user_attrs}}
            self.study.enqueue_trial(dict(trial.params), user_attrs=attrs, skip_if_exists=False)
        summary = TrialSummary(trial.number, state, job.baseline, job.config, failure_class=failure_class,
                               reason=message, validation=_mark(trial))
        self._emit(TrialDone(summary))
        return summary

    def _infeasible(self, trial: optuna.Trial, config: EngineConfig, baseline: bool,
                    violations: list[str]) -> TrialSummary:
        """Rejected before launch: told to Optuna as a trial that breaks a constraint, never launched."""
        predicted = PREDICTED_KV_INSUFFICIENT if any(v.startswith(PREDICTED_KV_INSUFFICIENT)
                                                     for v in violations) else None
        trial.set_user_attr("infeasible", violations)
        trial.set_user_attr("feasible", False)
        if predicted is not None:
            trial.set_user_attr("failure_class", predicted)
        trial.set_constraint("search_space_rules", float(len(violations)))
        self._not_measured(trial, config, TrialState.INFEASIBLE, Rejection(violations), failure_class=predicted,
                           message="; ".join(violations) if predicted else None)
        # Objective values are required with a completed trial; these are the worst possible and marked so.
        trial.set_user_attr("objective_values", "not measured: rejected before launch")
        self.study.tell(trial, [0.0, self.settings.request_timeout_s])
        summary = TrialSummary(trial.number, TrialState.INFEASIBLE, baseline, config, failure_class=predicted,
                               reason="; ".join(violations), validation=_mark(trial))
        self._emit(TrialDone(summary))
        return summary

    def _conclude(self, trial: optuna.Trial, config: EngineConfig, baseline: bool, outcome: TrialOutcome,
                  trace: Trace, best_capacity: tuple[float | None, float | None] = (None, None)) -> TrialSummary:
        record = outcome.record
        m = record.measurement
        scored: Score | None = None
        failure_class = reason = None
        judged = [JudgedProbe.of(run, self.ctx.boundary) for run in outcome.probes] \
            if self.settings.load.mode == "search" else []
        capacity = None
        if judged:
            capacity = capacity_of(judged, self.settings.load.for_launch(_mark(trial) is not None),
                                   self.ctx.selection.rate_scale or 1.0, *best_capacity)
            trial.set_user_attr("capacity_rps", capacity.rps)
            trial.set_user_attr("capacity_search", capacity.ended)
        if record.failure is not None:
            state, failure_class, reason = TrialState.FAILED, record.failure.kind.value, record.failure.message
            trial.set_user_attr("failure_class", failure_class)
            trial.set_user_attr("failure_message", reason[:500])
            if record.failure.estimated_max_model_len is not None:
                trial.set_user_attr("estimated_max_model_len", record.failure.estimated_max_model_len)
        elif record.stop_reason is not None:
            state, reason = TrialState.PRUNED, record.stop_reason
            trial.set_user_attr("prune_reason", reason)
        elif m is None or m.e2e_s.p95 is None:
            state, failure_class, reason = TrialState.FAILED, "no_request_finished", "no request finished"
            trial.set_user_attr("failure_class", failure_class)
        else:
            state = TrialState.COMPLETE
            scored = score(m, self.ctx.boundary, trace.span_s, capacity, judge_pace=bool(judged),
                           whole_share=trace.whole_share)
            for key, value in scored.constraints.items():
                trial.set_constraint(key, value)
            trial.set_user_attr("feasible", scored.feasible)
            if scored.violations:
                trial.set_user_attr("violations", scored.violations)
        if m is not None:
            for key, value in measurement_attrs(m).items():
                trial.set_user_attr(key, value)
        held_by = limiting_resource(judged, m, EngineCaps.of(config.to_dict(), record.hardware),
                                    bound=self.ctx.boundary)
        if held_by is not None:  # for the dashboard: the kind, the load, the figures and a sentence
            trial.set_user_attr(LIMITING_RESOURCE_ATTR, held_by.to_dict())
        trial.set_user_attr("startup_s", record.timings.startup_s)
        resumed = [p.earlier_trial for p in record.probes if p.earlier_trial is not None]
        if resumed:
            trial.set_user_attr(RESUMED_ATTR, {"trials": sorted(set(resumed)), "probes": len(resumed)})
        trial.set_user_attr("compile_cache", record.timings.compile_cache.value)
        if KV_PREDICTION_ATTR in trial.user_attrs:
            try:
                logged = logged_kv_tokens(Path(record.log_path).read_text(errors="replace"))
            except OSError:  # no log came back from the worker: nothing to set beside the prediction
                logged = None
            if logged is not None:
                trial.set_user_attr(KV_LOGGED_ATTR, logged)
        stored = StoredTrial.from_record(
            self.settings.name, trial.number, record, state=state, attempt=_attempt(self.study, trial),
            score=scored, prune_reason=record.stop_reason,
            finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), probes=judged,
            validation=_mark(trial))
        self.repo.save_trial(stored, outcome.requests)
        if scored is not None:
            self.study.tell(trial, list(scored.objectives))
        else:
            self.study.tell(trial, state=OptunaState.PRUNED if state is TrialState.PRUNED else OptunaState.FAIL)
        summary = TrialSummary(trial.number, state, baseline, config, scored, failure_class, reason, _mark(trial))
        self._emit(TrialDone(summary))
        return summary
