"""Running a stored study: its trials on Ray workers, `parallel` at a time, each scored, stored and told to
Optuna, and its validation. The only module of tuner.study that imports Ray; the parts of a run are beside it: the
study opened (`open_study`), each trial's launch (`launches`) and end (`ledger`), the time it has (`launch_time`),
the run as stored (`run_record`), the paired validation's job (`paired_validation`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable

import ray
from optuna.exceptions import StorageInternalError
from optuna.storages import fail_stale_trials
from optuna.trial import TrialState as OptunaState
from sqlalchemy.exc import OperationalError

from tuner.common.errors import TunerError
from tuner.common.hardware import detect_hardware
from tuner.storage import DatabaseUnreachable, StoredTrial, TrialState
from tuner.study.budget import RunBudget
from tuner.study.events import (BUDGET_END, NO_TIME_LEFT, STOP_POLL_S, WINDOW_END, BudgetPlanned, PoolReady, RunEvent,
                                RunReport, TrialSummary, WorkerDone)
from tuner.study.launch_time import RunClock
from tuner.study.launches import TrialLaunches
from tuner.study.ledger import InFlight, TrialLedger
from tuner.study.open_study import OpenStudy
from tuner.study.paired_validation import HeldPair, held_for, pair_opens, run_opening, validate_paired
from tuner.study.plan import StoragePlan
from tuner.study.recommendation import validation_terms
from tuner.study.run_record import RunRecorder
from tuner.validation import Arm, Validation, interleaved, unstarted, validations
from tuner.workers.pool import WorkerLost, WorkerPool, WorkerResult

# Proposals rejected before launch cost no trial of a run's budget, up to this many in a row (a space whose
# rules reject almost everything must still end).
MAX_REJECTED_IN_A_ROW = 20


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
                lost = DatabaseUnreachable.from_error(self.opened.plan.url, lost)
            elif not isinstance(lost, DatabaseUnreachable):
                raise
            raise DatabaseUnreachable(f"{lost}; the run stopped, the trials in flight will be run again by the "
                                      f"next `tuner study run`") from None

    return guarded


class NothingToValidate(TunerError):
    """A study with no feasible configuration other than vLLM's default: there is no finalist to launch again."""


def _stop_in_flight(ledger: TrialLedger, pool: WorkerPool, in_flight: dict[ray.ObjectRef, InFlight], reason: str,
                    report: RunReport) -> None:
    """Kill the workers of the trials in flight (each engine dies with its worker), then record each trial:
    as it ended if it had just finished, else as stopped."""
    for job in in_flight.values():
        pool.kill_worker(job.slot)
    for ref, job in list(in_flight.items()):
        try:
            report.trials.append(ledger.finish(job, ray.get(ref)))
        except WorkerLost:
            pool.bring_back_files(job.slot)
            job.trial.set_user_attr("stop_reason", reason)
            report.trials.append(ledger.not_finished(job, TrialState.STOPPED, reason))
        finally:
            job.beat.stop()
            del in_flight[ref]


def _validation_arms(opened: OpenStudy, trials: list[StoredTrial], top: int, against_itself: bool) -> list[Arm]:
    """vLLM's default and the `top` finalists (`OpenStudy.finalists`), or the default twice (an A/A check).
    NothingToValidate where no configuration other than the default is a candidate."""
    if against_itself:
        return [Arm(0, None), Arm(1, None)]
    arms = [Arm(0, None), *(Arm(i, number) for i, number in enumerate(opened.finalists(trials, top), start=1))]
    if len(arms) == 1:
        raise NothingToValidate(f"study {opened.settings.name} has no feasible configuration other than vLLM's "
                                f"default to validate, nor, when none is feasible, one that carried some load within "
                                f"the boundary: keep the default")
    return arms


class StudyRunner:
    """Runs a stored study's trials on Ray workers, `parallel` at a time: ask, launch and measure on a slot,
    score, store, tell, and ask again as soon as a slot frees; then, if asked, its validation."""

    def __init__(self, name: str, plan: StoragePlan, *, prune: bool = True, parallel: int | None = None,
                 ray_address: str | None = None, on_event: Callable[[RunEvent], None] | None = None):
        self.opened = OpenStudy.open(name, plan)
        self.parallel = parallel
        self.ray_address = ray_address
        self._emit = on_event or (lambda event: None)
        self._stop_reason: str | None = None
        self.recorder = RunRecorder(self.opened, parallel or 1)
        self.clock = RunClock(self.opened, self.recorder)
        self.ledger = TrialLedger(self.opened, self._emit)
        self.launches = TrialLaunches(self.opened, self.ledger, prune, self._emit)
        self._held: HeldPair | None = None  # the opening pair's engines, kept for the validation

    def close(self) -> None:
        """Stop the engines and pool a run kept for a validation (`run_opening`) that did not take them."""
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def stop(self, reason: str) -> None:
        """End the run from outside (another thread, a signal handler): no trial starts any more, the trials in
        flight are stopped and recorded as stopped with this reason, and `run` returns."""
        self._stop_reason = self._stop_reason or reason

    def _stop_or_end(self, stop_at: float | None) -> str | None:
        """Why the run must stop now: a stop asked from outside, or `stop_at` passed; None while it may go on."""
        return self._stop_reason or (WINDOW_END if stop_at is not None and time.time() >= stop_at else None)

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
        if n_trials != 0 and self.clock.no_time_for_a_trial(deadline, stop_at):
            report.stopped_early = NO_TIME_LEFT
            return report
        tp = self.opened.ctx.space.baseline().tensor_parallel_size or 1
        hardware = detect_hardware()
        started = time.time() if budget is None else budget.started_at
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(WorkerPool(self.parallel, ray_address=self.ray_address,
                                                  tensor_parallel_size=tp, local_gpus=hardware.gpu_count))
            self.recorder.slots = len(pool.slots)
            self.recorder.record(started, pool.slots[0].gpus, budget)
            self._emit(PoolReady(len(pool.slots), pool))
            # A search under a budget says its plan, once more when its first trial's time is known; a validation
            # (launches queued first) has none to say.
            planned = budget is None or n_trials == 0 or not self.clock.searching()
            at_end = WINDOW_END
            if budget is not None:
                budget_end = budget.end(self.recorder.slots)
                if budget_end is not None and (stop_at is None or budget_end < stop_at):
                    stop_at, at_end = budget_end, BUDGET_END
                if not planned:
                    report.plan = self.clock.budget_plan(budget, n_trials)
                    self._emit(BudgetPlanned(report.plan))
                    planned = report.plan.measured > 0
            free = [slot.index for slot in pool.slots]
            freed_at: dict[int, float] = {}
            in_flight: dict[ray.ObjectRef, InFlight] = {}
            begun = rejected = 0
            try:
                if budget is not None and pair_opens(self.opened, self.clock, budget, n_trials, pool.slots):
                    begun, unpaired, self._held = run_opening(
                        self.launches, self.clock, self.recorder, self._emit, pool, stack, budget, n_trials,
                        functools.partial(self._stop_or_end, stop_at), report)
                    planned = planned or report.plan is not None
                    for job, spec in unpaired:
                        in_flight[pool.submit(free.pop(0), spec)] = job
                while self._held is None:
                    reason = self._stop_reason or (at_end if stop_at is not None and time.time() >= stop_at
                                                   else None)
                    if reason is not None:
                        report.stopped_early = reason
                        _stop_in_flight(self.ledger, pool, in_flight, reason, report)
                        break
                    while free and (n_trials is None or begun < n_trials) and report.stopped_early is None:
                        if budget is not None and (short := self.clock.budget_stop(budget)) is not None:
                            report.stopped_early = short
                            break
                        if self.clock.no_time_for_a_trial(deadline, stop_at):
                            report.stopped_early = NO_TIME_LEFT
                            break
                        begun += 1
                        # Trials of a driver that died (before this run or during it) are failed now and
                        # re-enqueued once with the same configuration, so the next ask runs them again.
                        fail_stale_trials(self.opened.study)
                        self.ledger.record_interrupted()
                        launch = self.launches.start(free[0])
                        if isinstance(launch, TrialSummary):  # rejected before launch: the slot stays free
                            report.trials.append(launch)
                            rejected += 1
                            if rejected <= MAX_REJECTED_IN_A_ROW:
                                begun -= 1  # costs no trial of the budget, as long as proposals keep coming
                            continue
                        rejected = 0
                        launch[0].slot_freed_at = freed_at.get(free[0])
                        in_flight[pool.submit(free.pop(0), launch[1])] = launch[0]
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
                        report.trials.append(self.ledger.lost(job, exc))
                        pool.replace_worker(job.slot)
                        begun -= 1  # the re-run of a lost trial does not use up the budget
                    else:
                        # Scheduling overhead: from the slot freeing to the launch of this trial's engine.
                        launched, freed = result.outcome.launched_at, job.slot_freed_at
                        waited = None if launched is None or freed is None else launched - freed
                        self._emit(WorkerDone(job.trial.number, job.slot, result.node, waited))
                        report.trials.append(self.ledger.finish(job, result))
                        if budget is not None and not planned:
                            # The first trial's time replaces the trace's span as the plan's estimate.
                            report.plan = self.clock.budget_plan(budget, n_trials and n_trials - begun)
                            self._emit(BudgetPlanned(report.plan))
                            planned = True
                    finally:
                        job.beat.stop()
                        self.recorder.record(trial=job.trial.number)
                    free.append(job.slot)
            finally:
                # Ctrl-C or any error: the pool's shutdown kills every worker and so every engine. The trials
                # in flight stay RUNNING without heartbeat, so the next driver re-runs them.
                for job in in_flight.values():
                    job.beat.stop()
        self.recorder.record()
        report.spent = self.recorder.spent()
        return report

    @_stops_when_the_database_is_lost
    def validate(self, top: int, repeats: int, *, against_itself: bool = False, deadline: float | None = None,
                 stop_at: float | None = None, budget: RunBudget | None = None,
                 paired: bool = True) -> tuple[Validation, RunReport]:
        """Launch the validation's arms (`_validation_arms`) `repeats` times each, round by round, each launch a trial
        marked as a validation launch; then judge them. `deadline` and `stop_at` bound it as they bound `run`; under a
        budget, a validation whose launches cannot all end before the budget's end is not begun. Where the platform
        offers it (`pairing`) and `paired` allows, the rounds run paired on one GPU (`validate_paired`), on the engines
        the run opened with where they serve (`held_for`); the verdict says how the launches ran."""
        trials = self.opened.trials()
        arms = _validation_arms(self.opened, trials, top, against_itself)
        run = max((t.validation.run for t in trials if t.validation is not None), default=0) + 1
        held, self._held = held_for(self._held, [arm.of_trial for arm in arms], paired), None
        with contextlib.closing(held) if held is not None else contextlib.nullcontext():
            return self._launch_validation(arms, run, repeats, deadline, stop_at, budget, paired, held)

    def _launch_validation(self, arms: list[Arm], run: int, repeats: int, deadline: float | None,
                           stop_at: float | None, budget: RunBudget | None, paired: bool,
                           held: HeldPair | None) -> tuple[Validation, RunReport]:
        """`validate`'s launches, queued, run and judged: paired on the engines `held` where they serve."""
        terms = validation_terms(self.opened.settings)
        # Nothing is queued for a validation that cannot start.
        if self.clock.no_time_for_a_trial(deadline, stop_at, validation=True):
            return unstarted(run, repeats, arms, *terms), RunReport(stopped_early=NO_TIME_LEFT)
        if budget is not None and (short := self.clock.budget_short(dataclasses.replace(budget, pairing=paired),
                                                                len(arms) * repeats, len(arms),
                                                                held is not None)) is not None:
            return unstarted(run, repeats, arms, *terms), RunReport(stopped_early=short, spent=self.recorder.spent())
        frozen = self.opened.study.get_trials(deepcopy=False)
        # Configurations queued before (the baseline of a study not run yet, say) are asked first: they run too.
        queued = sum(t.state is OptunaState.WAITING for t in frozen)
        marks = interleaved(arms, repeats, run)
        for mark in marks:
            self.launches.queue(mark, None if mark.of_trial is None else frozen[mark.of_trial])
        plan = self.clock.pairing(len(arms), len(marks), queued, paired, deadline, stop_at, held is not None)
        design = plan.text
        if plan.paired:
            # The paired job is stopped at the window's end or the budget's, as `run` stops its trials.
            ends = [t for t in (stop_at, budget.end(self.recorder.slots) if budget is not None else None)
                    if t is not None]
            report, design = validate_paired(self.launches, self.recorder, self.ray_address, self._emit,
                                             functools.partial(self._stop_or_end, min(ends, default=None)), held)
            # Launches that could not run paired were queued again: they run as interleaved launches.
            left = len(self.opened.study.get_trials(deepcopy=False, states=(OptunaState.WAITING,)))
            if left and report.stopped_early is None:
                rest = self.run(left, deadline, stop_at=stop_at, budget=budget)
                report = dataclasses.replace(rest, trials=report.trials + rest.trials)
        else:
            if held is not None:  # its engines would keep the GPU the launches need
                held.close()
            report = self.run(queued + len(marks), deadline, stop_at=stop_at, budget=budget)
        judged = [v for v in validations(self.opened.trials(), *terms) if v.run == run]
        return (dataclasses.replace(judged[0], design=design) if judged
                else unstarted(run, repeats, arms, *terms)), report
