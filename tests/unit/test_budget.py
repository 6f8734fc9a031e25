"""A run's budget: when it ends on its slots, and the share of it the search leaves to the validation."""

from __future__ import annotations

import pytest

from tuner.study.budget import BudgetPlan, RunBudget


def test_a_budget_of_gpu_time_ends_sooner_on_more_slots():
    budget = RunBudget(started_at=1000.0, budget_s=1200.0)
    assert budget.end(1) == 2200.0 and budget.end(4) == 1300.0


def test_a_window_and_a_budget_end_at_the_sooner():
    assert RunBudget(1000.0, budget_s=1200.0, window_end=1500.0).end(1) == 1500.0
    assert RunBudget(1000.0, window_end=1500.0).end(2) == 1500.0
    assert RunBudget(1000.0).end(1) is None and RunBudget(1000.0).search_end(1, 60.0) is None


def test_the_search_ends_where_the_validations_launches_must_begin():
    # 20 minutes on one GPU; four validation launches of 150 s each are kept for: the search ends 10 minutes in.
    budget = RunBudget(1000.0, budget_s=1200.0, validation_launches=4)
    assert budget.validation_s(1, 150.0) == 600.0
    assert budget.search_end(1, 150.0) == 1600.0
    # On two slots the four launches take two rounds.
    assert budget.validation_s(2, 150.0) == 300.0 and budget.search_end(2, 150.0) == 1300.0


def test_a_validation_that_cannot_fit_leaves_the_search_the_whole_budget():
    budget = RunBudget(1000.0, budget_s=300.0, validation_launches=4)
    assert budget.search_end(1, 150.0) == budget.end(1) == 1300.0


@pytest.mark.parametrize("fits, said", [(True, ", then 4 validation launches of 2m30s (10m00s kept for them)"),
                                        (False, "; 4 validation launches of 2m30s do not fit, so the answer will "
                                                "not be validated")])
def test_the_plan_says_what_it_keeps_and_what_does_not_fit(fits, said):
    plan = BudgetPlan("GPU", 1, 1200.0, 120.0, 150.0, 5, 4, fits, 3, probes=6)
    assert plan.text() == (f"budget 20m00s of GPU time on 1 GPU: about 5 search trials of 2m00s (at most 6 probes "
                           f"each){said}; estimated from 3 trials")


def test_before_any_trial_the_plan_gives_no_figure():
    plan = BudgetPlan("CPU slot", 2, 600.0, 1.9, 1.9, 300, 4, True, 0)
    assert plan.text() == ("budget 10m00s of CPU slot time on 2 CPU slots: 4 validation launches to keep time for; "
                           "no trial measured yet, so the trials are planned once the first has ended")
