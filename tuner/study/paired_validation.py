"""Runs on one GPU slot with vLLM's sleep mode, one engine per arm taking turns (`tuner.workers.paired`).

A validation's queued launches run paired: one job launches an engine per arm and probes the arms in turn, round by
round; each arm's round is then concluded as its launch would be, marked paired.

A run under a budget that keeps time for such a validation opens with its queued pair paired (`open_pair`): vLLM's
default and the configuration queued beside it before the search (the precision check), each a search trial, run
as the first round of engines that are then held asleep. Where the budget leaves no search trial after them, the
validation's rounds go on on those engines (`validate_paired` with the `HeldPair`) and neither starts again: on an
H100 that saves the two cold starts (111 s and 140 s) of a validation that would launch them anew."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial

from tuner.common.hardware import detect_hardware
from tuner.storage import TrialState
from tuner.study.attrs import BASELINE_ATTR, VALIDATION_ATTR
from tuner.study.budget import RunBudget
from tuner.study.events import STOP_POLL_S, BudgetPlanned, PoolReady, RunEvent, RunReport, TrialSummary
from tuner.study.launch_time import RunClock
from tuner.study.launches import TrialLaunches
from tuner.study.ledger import InFlight, TrialLedger
from tuner.study.open_study import OpenStudy, mark_of
from tuner.study.run_record import RunRecorder
from tuner.validation import PAIRED, Pairing, paired_design
from tuner.workers.paired import PairedSpec
from tuner.workers.pool import PairedResult, Slot, WorkerLost, WorkerPool, WorkerResult
from tuner.workers.trial import TrialSpec

# How a validation that went on on the opening pair's engines says so, after `PAIRED`.
ON_THE_OPENING_PAIR = ", on the engines that measured the search's first two trials"


@dataclass
class HeldPair:
    """The opening pair's engines, asleep on `slot` of `pool`, which outlives the run's search for the validation
    (`_stack` owns it): the search trials they measured, vLLM's default first."""

    pool: WorkerPool
    slot: Slot
    trials: tuple[int, int]
    _stack: contextlib.ExitStack = field(repr=False)
    _closed: bool = False

    def serves(self, arm_trials: list[int | None]) -> bool:
        """Whether the engines are those of a validation of these arms' trials (vLLM's default as None)."""
        return arm_trials == [None, self.trials[1]]

    def close(self) -> None:
        """Stop the engines, then the pool; once."""
        if self._closed:
            return
        self._closed = True
        try:
            self.pool.release_pair(self.slot.index)
        finally:
            self._stack.close()

    @contextlib.contextmanager
    def kept(self) -> Iterator[tuple[WorkerPool, Slot]]:
        """The pool and slot, closed once done with."""
        try:
            yield self.pool, self.slot
        finally:
            self.close()


def held_for(held: HeldPair | None, arm_trials: list[int | None], paired: bool) -> HeldPair | None:
    """`held` where its engines are those of a paired validation of these arms' trials (`HeldPair.serves`); else
    None, and `held`, if any, closed."""
    if held is not None and not (paired and held.serves(arm_trials)):
        held.close()
        return None
    return held


def pair_opens(opened: OpenStudy, clock: RunClock, budget: RunBudget, n_trials: int | None, slots: list[Slot]) -> bool:
    """Whether a run opens with its queued pair (`open_pair`): under a budget that keeps time for a validation of two
    configurations that pairs here (`RunClock.pairs`), on one GPU slot, where the queue begins with vLLM's default
    and one more configuration queued before the search, neither run before."""
    if not budget.validation_launches or budget.validation_arms != 2 or not clock.pairs(2, budget.pairing).paired:
        return False
    if (n_trials is not None and n_trials < 2) or len(slots) != 1 or not slots[0].gpus:
        return False
    waiting = opened.waiting()[:2]

    def first_run(trial: FrozenTrial) -> bool:
        return mark_of(trial) is None and opened.rerun_of(trial) is None

    return len(waiting) == 2 and bool(waiting[0].user_attrs.get(BASELINE_ATTR)) and all(map(first_run, waiting))


@dataclass
class Opening:
    """How the opening pair ended: its trials as concluded, the launches to run unpaired instead (one refused
    before launch leaves the other to run alone), whether its engines are held, and why the run must stop."""

    trials: list[TrialSummary] = field(default_factory=list)
    unpaired: list[tuple[InFlight, TrialSpec]] = field(default_factory=list)
    held: bool = False
    stopped_early: str | None = None


def open_pair(launches: TrialLaunches, pool: WorkerPool, slot: Slot,
              stop_reason: Callable[[], str | None]) -> Opening:
    """Ask Optuna for the queued pair and run it as the first round of a paired job whose engines are then held
    (`PairedSpec` with keep); each trial concluded as a search trial. A trial the pairing could not run is recorded
    as not run and queued again; a lost worker's trials as lost, its slot given a new worker."""
    ledger = launches.ledger
    opening = Opening()
    started = [launches.start(slot.index) for _ in range(2)]
    jobs = [s for s in started if not isinstance(s, TrialSummary)]
    opening.trials = [s for s in started if isinstance(s, TrialSummary)]
    if len(jobs) < 2:  # one refused before launch: the other runs as a launch of its own
        opening.unpaired = jobs
        return opening
    try:
        result = pool.run_paired(slot.index, PairedSpec((tuple(spec for _, spec in jobs),)), stop_reason,
                                 STOP_POLL_S, keep=True)
    except WorkerLost as exc:
        opening.trials += [ledger.lost(job, exc) for job, _ in jobs]
        pool.replace_worker(slot.index)
        return opening
    finally:
        for job, _ in jobs:
            job.beat.stop()
    if isinstance(result, str):  # stopped: the worker, and its engines, were killed
        opening.stopped_early = result
        opening.trials += [ledger.not_finished(job, TrialState.STOPPED, result) for job, _ in jobs]
        return opening
    if not result.rounds:
        opening.trials += [ledger.not_finished(job, TrialState.STOPPED, f"not run paired: {result.fallback}")
                           for job, _ in jobs]
        return opening
    opening.trials += [ledger.finish(job, arm) for (job, _), arm in zip(jobs, result.rounds[0])]
    opening.held = result.fallback is None
    return opening


# What a trial's end counts against a run's trials when it was not measured: none of these uses one up.
NOT_MEASURED = (TrialState.STOPPED, TrialState.WORKER_LOST, TrialState.INFEASIBLE)


def run_opening(launches: TrialLaunches, clock: RunClock, recorder: RunRecorder, emit: Callable[[RunEvent], None],
                pool: WorkerPool, stack: contextlib.ExitStack, budget: RunBudget, n_trials: int | None,
                stop_reason: Callable[[], str | None],
                report: RunReport) -> tuple[int, list[tuple[InFlight, TrialSpec]], HeldPair | None]:
    """A run's opening pair (`open_pair`), into `report`: the trials it counts against `n_trials`, the launches left
    to run unpaired, and, where the budget then leaves no search trial (`RunClock.budget_stop`), its engines held
    for the validation, the pool taken out of `stack`; elsewhere they are stopped."""
    slot = pool.slots[0]
    opening = open_pair(launches, pool, slot, stop_reason)
    report.trials += opening.trials
    report.stopped_early = opening.stopped_early
    for summary in opening.trials:
        recorder.record(trial=summary.number)
    measured = sum(t.state not in NOT_MEASURED for t in opening.trials)
    if measured:  # the plan, now from what the pair took
        report.plan = clock.budget_plan(budget, n_trials and n_trials - measured)
        emit(BudgetPlanned(report.plan))
    held = None
    if opening.held:
        if (short := clock.budget_stop(budget)) is not None:
            report.stopped_early = short
            held = HeldPair(pool, slot, (opening.trials[0].number, opening.trials[1].number), stack.pop_all())
        else:
            pool.release_pair(slot.index)
    return measured + len(opening.unpaired), opening.unpaired, held


@contextlib.contextmanager
def _pool_of_one(ray_address: str | None, tp: int) -> Iterator[tuple[WorkerPool, Slot]]:
    with WorkerPool(1, ray_address=ray_address, tensor_parallel_size=tp,
                    local_gpus=detect_hardware().gpu_count) as pool:
        yield pool, pool.slots[0]


def validate_paired(launches: TrialLaunches, recorder: RunRecorder, ray_address: str | None,
                    emit: Callable[[RunEvent], None], stop_reason: Callable[[], str | None],
                    held: HeldPair | None = None) -> tuple[RunReport, str]:
    """Run the queued validation launches paired on one GPU slot, on the engines `held` (closed once done) or on a
    new pool's, stopped when `stop_reason` gives one. Launches that could not run paired (a refusal, a stop, a lost
    worker) are recorded as not run and queued again. Returns the report and how the launches ran."""
    opened, ledger = launches.opened, launches.ledger
    report = RunReport()
    tp = opened.ctx.space.baseline().tensor_parallel_size or 1
    with held.kept() if held is not None else _pool_of_one(ray_address, tp) as (pool, slot):
        recorder.record(time.time(), slot.gpus)
        if held is None:
            emit(PoolReady(1, pool))
        if not slot.gpus:  # a Ray cluster elsewhere, without the GPU this machine has
            return report, Pairing(False, "the Ray cluster's slots have no GPU").text
        jobs: dict[tuple[int, int], tuple[InFlight, TrialSpec]] = {}  # by (round, arm)
        refused = []  # before launch, and recorded so
        for _ in opened.waiting():
            started = launches.start(slot.index)
            if isinstance(started, TrialSummary):
                refused.append(started)
                continue
            mark = mark_of(started[0].trial)
            assert mark is not None
            jobs[mark.round, mark.arm] = started
        report.trials += refused
        rounds, arms = sorted({r for r, _ in jobs}), sorted({a for _, a in jobs})
        done: list[tuple[InFlight, WorkerResult]] = []
        try:
            if refused:
                fallback: str | None = "a configuration was refused before launch"
            else:
                spec = PairedSpec(tuple(tuple(jobs[r, a][1] for a in arms) for r in rounds))
                result = pool.run_paired(slot.index, spec, stop_reason, STOP_POLL_S)
                if isinstance(result, str):
                    report.stopped_early = fallback = result
                else:
                    fallback = result.fallback
                    done = _arm_rounds(jobs, rounds, arms, result)
        except WorkerLost as exc:
            report.trials += [ledger.lost(job, exc) for job, _ in jobs.values()]
            return report, (f"interleaved launches: the worker of the paired validation was lost "
                            f"({exc.__class__.__name__})")
        finally:
            for job, _ in jobs.values():
                job.beat.stop()
        report.trials += _conclude_paired(ledger, recorder, done)
        for job, _ in jobs.values():
            why = report.stopped_early or f"not run paired: {fallback}"
            report.trials.append(ledger.not_finished(job, TrialState.STOPPED, why))
    report.spent = recorder.spent()
    if report.stopped_early is not None:
        return report, PAIRED
    design = paired_design(len(done) // max(len(arms), 1), len(rounds), fallback)
    return report, design + (ON_THE_OPENING_PAIR if held is not None and design == PAIRED else "")


def _arm_rounds(jobs: dict[tuple[int, int], tuple[InFlight, TrialSpec]], rounds: list[int], arms: list[int],
                result: PairedResult) -> list[tuple[InFlight, WorkerResult]]:
    """Each arm's round run in full with the launch it was asked for, taken out of `jobs`."""
    return [(jobs.pop((r, a))[0], arm_result) for r, round_results in zip(rounds, result.rounds)
            for a, arm_result in zip(arms, round_results)]


def _conclude_paired(ledger: TrialLedger, recorder: RunRecorder,
                     done: list[tuple[InFlight, WorkerResult]]) -> list[TrialSummary]:
    """Each arm's round concluded as a launch, marked paired."""
    summaries = []
    for job, arm_result in done:
        job.beat.stop()
        mark = mark_of(job.trial)
        assert mark is not None
        job.trial.set_user_attr(VALIDATION_ATTR, dataclasses.replace(mark, paired=True).to_dict())
        summaries.append(ledger.finish(job, arm_result))
        recorder.record(trial=job.trial.number)
    return summaries
