"""Which trials a recommendation is chosen from: those that carry your traffic within the boundary, and when none
does, those that carry the most of it, said plainly."""

from __future__ import annotations

from factories import MACHINE, measurement
from tuner.analysis.scoring import Capacity, Score
from tuner.storage import StoredTrial, TrialState, ValidationMark
from tuner.analysis.scoring import boundary
from tuner.study.recommendation import Recommendation, candidates, carried_by_others, shortfall_sentence
from tuner.workers.engine_config import EngineConfig

OVER = "ttft_p95_s 2.598 s is over the limit 2.000 s"


def _trial(number: int, capacity_rps: float | None, violations: list[str], state: TrialState = TrialState.COMPLETE,
           mark: ValidationMark | None = None) -> StoredTrial:
    m = measurement()
    score = None if state is not TrialState.COMPLETE else Score(
        m.completed_rps, m.e2e_s.p95, m.output_tps, 1.0, {}, violations,
        Capacity(capacity_rps, None, None, None, 4, "bracketed"))
    return StoredTrial("demo", number, 1, state, EngineConfig(max_num_seqs=number + 1), "vllm serve m", m, None,
                       None, None, None, None, None, MACHINE, "0.32.0", "2025-01-01T00:00:00+00:00", None, score,
                       validation=mark)


def test_the_trials_that_carry_your_traffic_are_the_candidates_when_any_does():
    trials = [_trial(0, 1.1, [OVER]), _trial(1, 2.0, []), _trial(2, 3.0, [OVER])]
    assert [t.trial_number for t in candidates(trials)] == [1]


def test_when_none_carries_your_traffic_those_that_carried_some_load_are_the_candidates():
    launch = ValidationMark(1, 0, 1, 0, None)
    trials = [_trial(0, 1.1, [OVER]), _trial(1, None, [OVER]),  # no load passed: it carries none
              _trial(2, None, [], TrialState.PRUNED), _trial(3, 3.0, [OVER], mark=launch), _trial(4, 0.6, [OVER])]
    assert [t.trial_number for t in candidates(trials)] == [0, 4]
    assert candidates([_trial(1, None, [OVER])]) == []


def test_a_recommendation_short_of_your_traffic_says_so_with_how_it_breaks_the_boundary():
    assert shortfall_sentence([OVER]) == (f"it does not carry your traffic within the boundary ({OVER}), and no "
                                          "configuration tried does: it carries the most of it")


def test_a_kept_default_short_of_your_traffic_does_not_claim_that_no_configuration_carries_it():
    """Validation kept vLLM's default (trial 0, short of your traffic as the search measured it) although trial 1
    carried your traffic: "no configuration tried does" would be false, so the sentence says what happened."""
    launch = ValidationMark(1, 1, 2, 0, None)
    trials = [_trial(0, 1.1, [OVER]), _trial(1, 2.0, []), _trial(2, 3.0, [], mark=launch)]
    assert carried_by_others(trials, 0) and not carried_by_others(trials, 1)
    assert not carried_by_others([trials[0], trials[2]], 0)  # a validation launch is no configuration tried
    kept = Recommendation(trials[0], boundary("interactive"), trials[0], others_carry=carried_by_others(trials, 0))
    assert kept.shortfall() == (f"it does not carry your traffic within the boundary ({OVER}) as the search measured "
                                "it; other configurations tried did, yet launched again none carried more than "
                                "vLLM's default beyond noise")
    alone = Recommendation(trials[0], boundary("interactive"), trials[0])
    assert alone.shortfall() == shortfall_sentence([OVER])
    assert Recommendation(trials[1], boundary("interactive"), trials[0]).shortfall() is None
