"""A validation's queued launches run paired on one GPU slot: one job (`WorkerPool.run_paired`) launches one engine
per arm with sleep mode and probes the arms in turn, round by round; each arm's round is then concluded as its
launch would be, marked paired."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from tuner.common.hardware import detect_hardware
from tuner.storage import TrialState
from tuner.study.attrs import VALIDATION_ATTR
from tuner.study.events import STOP_POLL_S, PoolReady, RunEvent, RunReport, TrialSummary
from tuner.study.launches import TrialLaunches
from tuner.study.ledger import InFlight
from tuner.study.open_study import mark_of
from tuner.study.run_record import RunRecorder
from tuner.validation import PAIRED, Pairing, paired_design
from tuner.workers.paired import PairedSpec
from tuner.workers.pool import WorkerLost, WorkerPool, WorkerResult
from tuner.workers.trial import TrialSpec


def validate_paired(launches: TrialLaunches, recorder: RunRecorder, ray_address: str | None,
                    emit: Callable[[RunEvent], None], stop_reason: Callable[[], str | None]) -> tuple[RunReport, str]:
    """Run the queued validation launches paired on one GPU slot, stopped when `stop_reason` gives one. Launches
    that could not run paired (a refusal, a stop, a lost worker) are recorded as not run and queued again. Returns
    the report and how the launches ran."""
    opened, ledger = launches.opened, launches.ledger
    report = RunReport()
    tp = opened.ctx.space.baseline().tensor_parallel_size or 1
    with WorkerPool(1, ray_address=ray_address, tensor_parallel_size=tp,
                    local_gpus=detect_hardware().gpu_count) as pool:
        slot = pool.slots[0]
        recorder.record(time.time(), slot.gpus)
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
                    done = [(jobs.pop((r, a))[0], arm_result) for r, round_results in zip(rounds, result.rounds)
                            for a, arm_result in zip(arms, round_results)]
        except WorkerLost as exc:
            report.trials += [ledger.lost(job, exc) for job, _ in jobs.values()]
            return report, (f"interleaved launches: the worker of the paired validation was lost "
                            f"({exc.__class__.__name__})")
        finally:
            for job, _ in jobs.values():
                job.beat.stop()
        for job, arm_result in done:
            job.beat.stop()
            mark = mark_of(job.trial)
            assert mark is not None
            job.trial.set_user_attr(VALIDATION_ATTR, dataclasses.replace(mark, paired=True).to_dict())
            report.trials.append(ledger.finish(job, arm_result))
            recorder.record(trial=job.trial.number)
        for job, _ in jobs.values():
            why = report.stopped_early or f"not run paired: {fallback}"
            report.trials.append(ledger.not_finished(job, TrialState.STOPPED, why))
    report.spent = recorder.spent()
    if report.stopped_early is not None:
        return report, PAIRED
    return report, paired_design(len(done) // max(len(arms), 1), len(rounds), fallback)
