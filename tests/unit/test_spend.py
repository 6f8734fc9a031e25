"""What a study's answer cost: each launched trial's time split into startup, probes and draining, and the time
its runs held their slots beyond their trials' own as idle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.storage import StoredTrial
from tuner.storage.records import StoredRun
from tuner.storage.spend import GpuTime, Spend
from tuner.workers.compile_cache import CompileCache
from tuner.workers.measure import Pace, TrialTimings

from factories import measurement, probe_ladder, request_records, trial_record


def launched(number: int, startup_s: float, replay_s: float, windows: list[float], *,
             cache: CompileCache = CompileCache.COLD, earlier: int | None = None) -> StoredTrial:
    """A launched trial whose probes' arrivals lasted `windows` (seconds), the first probe resumed from trial
    `earlier` where given."""
    record = replace(trial_record(request_records(4), died=False),
                     timings=TrialTimings(startup_s, replay_s, 2.0, cache))
    probes = probe_ladder([(1.0 * (i + 1), "pass", 0.1, 1.0) for i in range(len(windows))])
    probes = [replace(p, probe=replace(p.probe, measurement=measurement(pace=Pace(w, 10, 10, 1.0, 1.0)),
                                       earlier_trial=earlier if i == 0 else None))
              for i, (p, w) in enumerate(zip(probes, windows))]
    return StoredTrial.from_record("s1", number, record, state="complete", score=None, probes=probes)


def test_a_trials_time_splits_into_startup_probes_and_draining():
    spent = GpuTime.of_trial(launched(3, 40.0, 100.0, [20.0, 30.0]))
    # Startup counts the engine's stop too; draining is the replay beyond the probes' arrivals.
    assert spent == GpuTime(startup_s=42.0, probes_s=50.0, draining_s=50.0)
    assert spent.total_s == 142.0


def test_probes_an_earlier_launch_measured_took_none_of_this_launchs_time():
    assert GpuTime.of_trial(launched(3, 40.0, 100.0, [20.0, 30.0], earlier=1)).probes_s == 30.0


def test_a_proposal_refused_before_launch_cost_nothing():
    refused = replace(launched(3, 40.0, 100.0, [20.0]), timings=None, probes=[])
    assert GpuTime.of_trial(refused) == GpuTime() and Spend.of([refused], []).trials == ()


def test_the_runs_time_beyond_their_trials_is_idle_and_starts_are_counted():
    trials = [launched(0, 40.0, 100.0, [50.0]), launched(1, 10.0, 100.0, [50.0], cache=CompileCache.WARM)]
    # One run of 2 slots for 200 s: 400 slot-seconds, of which the trials took 142 + 112.
    spend = Spend.of(trials, [StoredRun("s1", 1000.0, 1200.0, 2, 0, (0, 1))])
    assert spend.idle_s == pytest.approx(400 - 142 - 112)
    assert spend.total.total_s == pytest.approx(400.0)
    assert (spend.starts(CompileCache.COLD), spend.starts(CompileCache.WARM)) == (1, 1)
    assert spend.unit == "CPU slot" and spend.runs == 1
    assert spend.text().startswith("CPU slot time 6m40s: startup 54s, probes 1m40s, draining 1m40s, idle 2m26s; "
                                   "2 launches, 1 cold starts, 1 warm")


def test_gpu_slots_are_gpu_time_and_the_answer_reads_back():
    spend = Spend.of([launched(0, 40.0, 100.0, [50.0])], [StoredRun("s1", 0.0, 150.0, 1, 1, (0,))])
    assert spend.unit == "GPU" and spend.text().startswith("GPU time 2m30s")
    data = spend.to_dict()
    assert data["total"]["total_s"] == pytest.approx(150.0) and data["trials"][0]["compile_cache"] == "cold"
    assert GpuTime.from_dict(data["total"]) == spend.total
