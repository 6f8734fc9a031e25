"""How long a study expects its next trial to take, from what its finished trials took: a run with a deadline or a
window starts none that would end after it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factories import MACHINE, probe_ladder, request_records, study_settings, trial_record
from tuner.analysis.capacity import SETTLED_FROM_START, LoadPolicy
from tuner.storage import Repository, StoredTrial, TrialState
from tuner.study.budget import LaunchCost
from tuner.study.launch_time import expected_trial_s, launch_cost
from tuner.storage import ValidationMark
from tuner.workers.measure import TrialTimings


def _trial(number: int, total_s: float, *, validation: bool = False, study: str = "s1") -> StoredTrial:
    record = replace(trial_record(request_records(4), died=False), timings=TrialTimings(total_s - 2, 1.0, 1.0),
                     hardware=MACHINE)
    mark = ValidationMark(1, 1, 2, number % 2, None) if validation else None
    return StoredTrial.from_record(study, number, record, state=TrialState.COMPLETE, score=None, validation=mark)


def test_a_validation_launch_is_expected_to_take_what_the_validation_launches_took(tmp_path):
    # A validation launch searches with twice the probes: judged by the search trials, it would start where it
    # cannot end, and be stopped half measured.
    repo = Repository(f"sqlite:///{tmp_path / 'tuner.db'}")
    repo.migrate()
    settings = study_settings()
    repo.save_study(settings)
    assert expected_trial_s(repo, settings, 30.0, validation=True) == 30.0  # nothing finished: the trace's span
    for number, total_s in enumerate((100.0, 120.0, 110.0)):
        repo.save_trial(_trial(number, total_s), [])
    assert expected_trial_s(repo, settings, 30.0, validation=False) == pytest.approx(110.0)
    assert expected_trial_s(repo, settings, 30.0, validation=True) == pytest.approx(110.0)  # none of its kind yet
    # ...but vLLM's default searched its whole capacity, as a validation launch will, where search trials stop at the
    # best so far: its time is the better guess.
    assert expected_trial_s(repo, settings, 30.0, validation=True, baselines={1}) == pytest.approx(120.0)
    for number, total_s in ((3, 300.0), (4, 260.0)):
        repo.save_trial(_trial(number, total_s, validation=True), [])
    assert expected_trial_s(repo, settings, 30.0, validation=True) == pytest.approx(280.0)
    assert expected_trial_s(repo, settings, 30.0, validation=False) == pytest.approx(110.0)
    # A new study of the same model starts from the other studies' trials.
    other = replace(settings, name="s2")
    repo.save_study(other)
    assert expected_trial_s(repo, other, 30.0, validation=False) == pytest.approx(120.0)


def test_a_validation_launch_judged_by_the_default_takes_the_probes_of_a_search_from_its_capacity(tmp_path):
    # vLLM's default searched its whole capacity in 4 probes (the H100's, 2026-12-07: 140 s of probes); a validation
    # launch starts at the capacity its configuration showed, and settles its bracket in the reference probe, that
    # load and one step above it: 3 probes of the 4, each as long as the default's were.
    repo = Repository(f"sqlite:///{tmp_path / 'tuner.db'}")
    repo.migrate()
    settings = study_settings(load=LoadPolicy(mode="search", precision=0.1, probe_budget=5))
    repo.save_study(settings)
    ladder = probe_ladder([(1.0, "pass", 0.15, 7.0), (2.0, "inconclusive", 0.6, 16.0), (1.41, "pass", 0.2, 9.0),
                           (1.68, "pass", 0.3, 10.5)])
    record = replace(trial_record(request_records(4), died=False), timings=TrialTimings(108.0, 140.0, 4.0),
                     hardware=MACHINE)
    repo.save_trial(StoredTrial.from_record("s1", 0, record, state=TrialState.COMPLETE, score=None, probes=ladder), [])
    launch = launch_cost(repo, settings, 30.0, validation=True, baselines={0}, sleep_s=12.0)
    assert launch == LaunchCost(108.0, pytest.approx(144.0 / 4 * SETTLED_FROM_START), SETTLED_FROM_START, 12.0)
    # A search trial that follows takes what the default took, probes and all.
    assert expected_trial_s(repo, settings, 30.0, validation=False) == pytest.approx(252.0)
    # Once validation launches ran, theirs is the measure; a paired one's timings hold its engine's sleeps.
    done = replace(record, timings=TrialTimings(60.0, 90.0, 2.0))
    repo.save_trial(StoredTrial.from_record("s1", 1, done, state=TrialState.COMPLETE, score=None, probes=ladder[:3],
                                            validation=ValidationMark(1, 1, 2, 0, None)), [])
    assert launch_cost(repo, settings, 30.0, True, {0}, sleep_s=12.0) == LaunchCost(60.0, 92.0, 3, 12.0)
    repo.save_trial(StoredTrial.from_record("s1", 2, done, state=TrialState.COMPLETE, score=None, probes=ladder[:3],
                                            validation=ValidationMark(1, 1, 2, 1, 0, paired=True)), [])
    assert launch_cost(repo, settings, 30.0, True, {0}, sleep_s=12.0) == LaunchCost(60.0, 92.0, 3, 0.0)


def test_a_paired_launch_that_stored_its_sleeps_is_judged_without_them(tmp_path):
    # A paired launch's teardown holds its engine's sleeps; stored apart (`TrialTimings.sleep_s`), they are left out
    # of its probing, and the planner counts its own per probe instead.
    repo = Repository(f"sqlite:///{tmp_path / 'tuner.db'}")
    repo.migrate()
    settings = study_settings(load=LoadPolicy(mode="search", precision=0.1, probe_budget=5))
    repo.save_study(settings)
    ladder = probe_ladder([(1.0, "pass", 0.15, 7.0), (1.68, "pass", 0.3, 10.5), (2.1, "fail", 0.9, 20.0)])
    timings = TrialTimings(1.0, 90.0, 22.0, sleep_s=20.0)
    record = replace(trial_record(request_records(4), died=False), timings=timings, hardware=MACHINE)
    repo.save_trial(StoredTrial.from_record("s1", 2, record, state=TrialState.COMPLETE, score=None, probes=ladder,
                                            validation=ValidationMark(1, 2, 2, 1, 0, paired=True)), [])
    assert launch_cost(repo, settings, 30.0, True, {0}, sleep_s=12.0) == LaunchCost(1.0, 92.0, 3, 12.0)
    assert TrialTimings.from_dict(timings.to_dict()) == timings
