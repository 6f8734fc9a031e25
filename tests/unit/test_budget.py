"""A run's budget: when it ends on its slots, and the share of it the search leaves to the validation."""

from __future__ import annotations

import pytest

from tuner.study.budget import BudgetPlan, LaunchCost, RunBudget
from tuner.workers.paired import expected_sleep_s


def test_a_budget_of_gpu_time_ends_sooner_on_more_slots():
    budget = RunBudget(started_at=1000.0, budget_s=1200.0)
    assert budget.end(1) == 2200.0 and budget.end(4) == 1300.0


def test_a_window_and_a_budget_end_at_the_sooner():
    assert RunBudget(1000.0, budget_s=1200.0, window_end=1500.0).end(1) == 1500.0
    assert RunBudget(1000.0, window_end=1500.0).end(2) == 1500.0
    assert RunBudget(1000.0).end(1) is None and RunBudget(1000.0).search_end(1, 240.0) is None


def test_the_search_ends_where_the_validations_launches_must_begin():
    # 20 minutes on one GPU; four validation launches of 150 s each are kept for: the search ends 10 minutes in.
    budget = RunBudget(1000.0, budget_s=1200.0, validation_launches=4)
    launch = LaunchCost(startup_s=100.0, probing_s=50.0)
    assert launch.validation_s(4, 1) == 600.0
    assert budget.search_end(1, launch.validation_s(4, 1)) == 1600.0
    # On two slots the four launches take two rounds.
    assert launch.validation_s(4, 2) == 300.0 and budget.search_end(2, 300.0) == 1300.0


def test_a_paired_validation_starts_one_engine_per_arm():
    # Two arms, two rounds: two startups, then four launches' probes, one after the other on one GPU.
    assert LaunchCost(startup_s=100.0, probing_s=50.0).validation_s(4, 1, paired_arms=2) == 400.0


def test_a_paired_engine_sleeps_after_its_launch_and_every_other_probe():
    # The H100's first paired validation (2026-12-07): the default's engine took 12.4 s to fall asleep (15.0 GiB of
    # weights copied to host memory). Two arms, four launches of three probes: 2 sleeps after the launches, then one
    # every other probe, as the steps alternate the arms' order (A B, B A) and the engine awake goes on.
    sleep_s = expected_sleep_s(int(15.0 * 2**30))
    assert sleep_s == pytest.approx(12.5)
    launch = LaunchCost(startup_s=100.0, probing_s=105.0, probes=3, sleep_s=sleep_s)
    assert launch.validation_s(4, 1, paired_arms=2) == pytest.approx(2 * 100.0 + 4 * 105.0 + 8 * sleep_s)
    # On the engines the search's opening pair held, none starts or sleeps after its launch.
    assert launch.validation_s(4, 1, paired_arms=2, held=True) == pytest.approx(4 * 105.0 + 6 * sleep_s)
    # Launches one after the other never sleep.
    assert launch.validation_s(4, 1) == 4 * 205.0


def test_a_validation_that_cannot_fit_leaves_the_search_the_whole_budget():
    budget = RunBudget(1000.0, budget_s=300.0, validation_launches=4)
    assert budget.search_end(1, 600.0) == budget.end(1) == 1300.0


@pytest.mark.parametrize("fits, said", [(True, ", then 4 validation launches of 2m30s (10m00s kept for them)"),
                                        (False, "; 4 validation launches of 2m30s do not fit, so the answer will "
                                                "not be validated")])
def test_the_plan_says_what_it_keeps_and_what_does_not_fit(fits, said):
    plan = BudgetPlan("GPU", 1, 1200.0, 120.0, 150.0, 5, 4, fits, 3, probes=6)
    assert plan.text() == (f"budget 20m00s of GPU time on 1 GPU: about 5 search trials of 2m00s (at most 6 probes "
                           f"each){said}; estimated from 3 trials")
    # With nothing but vLLM's default to validate yet, a validation that fits lets the search into its share; one
    # that does not fit has no share to let it into.
    waiting = BudgetPlan("GPU", 1, 1200.0, 120.0, 150.0, 5, 4, fits, 3, probes=6, no_candidate=True).text()
    assert ("the search goes on into the validation's share" in waiting) == fits
    # Paired, the plan keeps what the paired launches need and says so.
    paired = BudgetPlan("GPU", 1, 1200.0, 120.0, 150.0, 5, 4, True, 3, probes=6, validation_s=400.0, paired=True)
    assert ", then 4 validation launches of 2m30s (paired on one GPU, 6m40s kept for them)" in paired.text()


def test_before_any_trial_the_plan_gives_no_figure():
    plan = BudgetPlan("CPU slot", 2, 600.0, 1.9, 1.9, 300, 4, True, 0)
    assert plan.text() == ("budget 10m00s of CPU slot time on 2 CPU slots: 4 validation launches to keep time for; "
                           "no trial measured yet, so the trials are planned once the first has ended")


# --- the runner's rule ---------------------------------------------------------------------------------------------

def _measured(runner, config, carried_rps: float) -> None:
    """A trial of `config` stored as run for 100 s: it carried `carried_rps` within the boundary."""
    from factories import MACHINE, measurement
    from tuner.analysis.scoring import Capacity, Score
    from tuner.storage import StoredTrial, TrialState
    from tuner.workers.measure import TrialTimings

    trial = runner.opened.study.ask()
    runner.launches.config(trial)
    runner.opened.repo.save_trial(StoredTrial(
        study_name="s", trial_number=trial.number, attempt=1, state=TrialState.COMPLETE, engine_config=config,
        serve_command=config.serve_command("tiny"), measurement=measurement(), failure_class=None,
        failure_message=None, log_excerpt=None, estimated_max_model_len=None, exit_code=None,
        timings=TrialTimings(40.0, 55.0, 5.0), hardware=MACHINE, vllm_version="0.32.0",
        started_at="2025-05-01T10:00:00+00:00", finished_at="2025-05-01T10:01:40+00:00",
        score=Score(carried_rps, 1.0, 100.0, 1.0, {}, [], Capacity(carried_rps, 1.0, 1.0, None, 1, "probes ran out"))),
        [])
    runner.opened.study.tell(trial, [carried_rps, 1.0])


def test_the_validations_share_is_kept_only_once_there_is_a_candidate_to_validate(tiny_model, tmp_path):
    import time

    from tuner.analysis.capacity import LoadPolicy
    from tuner.common.paths import bundled_trace
    from tuner.study.create import create_study
    from tuner.study.events import BUDGET_KEPT
    from tuner.study.plan import StoragePlan
    from tuner.study.runner import StudyRunner
    from tuner.traces.selection import TraceSelection

    plan = StoragePlan.resolve(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    create_study("s", model=tiny_model, trace_path=bundled_trace(), space="cpu-small", boundary_name="interactive",
                 limits={}, plan=plan, load=LoadPolicy(), selection=TraceSelection(max_requests=8, fit="clip"))
    runner = StudyRunner("s", plan)
    runner.recorder.slots = 1
    # 350 s left: one more 100 s trial ends before the end, not before the 400 s kept for 4 launches of 100 s.
    budget = RunBudget(time.time() - 150, budget_s=500, validation_launches=4)
    _measured(runner, runner.opened.ctx.space.baseline(), 10.0)
    plan_now = runner.clock.budget_plan(budget, None)
    # Nothing but vLLM's default to validate: the search goes on into the validation's share, and the plan says so.
    assert runner.clock.budget_stop(budget) is None
    assert plan_now.no_candidate and "the search goes on into the validation's share" in plan_now.text()
    # A configuration that carried more is a candidate: from now on the validation's share is kept.
    _measured(runner, runner.opened.ctx.space.suggest(runner.opened.study.ask()), 12.0)
    assert runner.clock.budget_stop(budget) == BUDGET_KEPT
    assert not runner.clock.budget_plan(budget, None).no_candidate
