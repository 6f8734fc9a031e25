"""Validation judged from its marked trials: the interleaved order, the gain's interval (checked against SciPy's
own Welch test), and the verdict in each case: recommended beyond noise, within noise (keep the default), the
default best, an A/A check, a launch that carried nothing."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from factories import MACHINE, measurement
from tuner.analysis.scoring import Capacity, Score
from tuner.storage import StoredTrial, TrialState, ValidationMark
from tuner.validation import (Arm, ArmResult, Pairing, Validation, gain_interval, interleaved, latest_validation,
                              paired_design, pairing, validations)
from tuner.workers.engine_config import EngineConfig

UNIT = "req/s within the boundary"


def _validation(default: tuple[float, ...], finalist: tuple[float, ...], of_trial: int | None = 3) -> Validation:
    n = len(default)
    return Validation(1, n, (ArmResult(Arm(0, None), tuple(range(10, 10 + n)), default),
                             ArmResult(Arm(1, of_trial), tuple(range(20, 20 + n)), finalist)), (), UNIT)


def test_every_arm_once_per_round_in_the_same_order():
    arms = [Arm(0, None), Arm(1, 4), Arm(2, 7)]
    marks = interleaved(arms, 3, run=2)
    assert [(m.round, m.of_trial) for m in marks] == [(r, t) for r in (1, 2, 3) for t in (None, 4, 7)]
    assert {m.run for m in marks} == {2} and {m.repeats for m in marks} == {3}
    assert marks[0].default and not marks[1].default
    with pytest.raises(ValueError, match="at least 2 repeats"):
        interleaved(arms, 1, run=1)


def test_the_interval_is_welchs_on_the_logs():
    values, reference = [2.9, 3.1, 3.4], [2.0, 2.2]
    found = gain_interval(values, reference)
    expected = stats.ttest_ind(np.log(values), np.log(reference), equal_var=False).confidence_interval(0.95)
    assert found.ratio == pytest.approx(math.exp(np.log(values).mean() - np.log(reference).mean()))
    assert (found.low, found.high) == pytest.approx((math.exp(expected.low), math.exp(expected.high)))
    assert found.repeats == (3, 2) and found.text().endswith("3 and 2 repeats")
    # Identical repeats on both sides leave nothing to widen the ratio by.
    same = gain_interval([2.0, 2.0], [1.0, 1.0])
    assert (same.ratio, same.low, same.high) == (2.0, 2.0, 2.0) and not same.includes_one
    # ...but never finer than what the measurement resolves: a load search at 10% precision cannot tell 2.2 from 2.
    coarse = gain_interval([2.2, 2.2], [2.0, 2.0], resolution=0.1)
    assert (coarse.low, coarse.high) == pytest.approx((1.0, 1.21)) and coarse.includes_one
    assert gain_interval(values, reference, resolution=0.1) == found  # already wider than the resolution
    with pytest.raises(ValueError):
        gain_interval([1.0, 0.0], [1.0, 1.0])  # a launch that carried nothing has no log


def test_repeats_that_agree_exactly_on_one_side_give_an_interval_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would reach the user's terminal
        found = gain_interval([3.24, 3.24], [1.14, 7.70])
    assert found.low < found.ratio < found.high and found.includes_one


def test_a_gain_beyond_noise_is_recommended_with_its_interval():
    v = _validation((2.0, 2.2), (2.9, 3.1))
    assert not v.keep_default and v.winner.arm.of_trial == 3 and not v.gain.includes_one
    assert v.sentence() == ("trial 3 carries more than vLLM's default (x1.43, 95% CI 1.08-1.89, 2 repeats each): "
                            "recommended")


def test_a_gain_within_noise_keeps_the_default():
    v = _validation((2.0, 2.6), (2.3, 2.5))
    assert v.gain.ratio > 1 and v.gain.includes_one and v.keep_default and v.winner.arm.of_trial is None
    assert v.sentence().startswith("vLLM's default is within noise of the best configuration found (trial 3: x1.05, "
                                   "95% CI ")
    assert v.sentence().endswith(", 2 repeats each): keep it")


def test_a_default_that_carries_more_is_kept():
    v = _validation((3.0, 3.1), (2.0, 2.1))
    assert v.keep_default and v.gain.ratio < 1
    assert v.sentence().startswith("vLLM's default carries at least as much as the best configuration found "
                                   "(trial 3: x0.67")


def test_an_a_a_check_says_whether_its_interval_includes_one():
    aa = _validation((2.0, 2.4), (2.1, 2.3), of_trial=None)
    assert aa.against_itself and aa.keep_default and aa.gain.includes_one
    assert aa.arms[1].arm.label == "vLLM's default (again)"
    assert aa.sentence().startswith("A/A check: vLLM's default against itself (x")
    assert aa.sentence().endswith("the interval includes 1, as it must for identical configurations")
    drifted = _validation((2.0, 2.0), (3.0, 3.0), of_trial=None)
    assert "excludes 1" in drifted.sentence()
    empty = _validation((2.0, 0.0), (2.1, 2.3), of_trial=None)
    assert empty.gain is None and empty.sentence() == (
        "A/A check: vLLM's default against itself gave no interval (vLLM's default carried no load within the "
        "boundary in 1 of 2 launches)")


def test_a_launch_that_carried_nothing_leaves_no_interval_and_says_so():
    v = _validation((2.0, 0.0), (2.9, 3.1))
    assert v.gain is None and not v.keep_default and v.winner.arm.of_trial == 3
    assert v.sentence() == ("no interval for trial 3 against vLLM's default (vLLM's default carried no load within "
                            "the boundary in 1 of 2 launches): trial 3 is recommended")
    worse = _validation((2.0, 2.1), (0.0, 3.1))
    assert worse.keep_default and worse.sentence().endswith(": keep vLLM's default")
    # Both carried nothing once (a machine that broke the boundary at every load in those launches): a higher
    # median of the finalist is no evidence, and the default stays.
    both = _validation((0.0, 0.4), (0.0, 0.96))
    assert both.gain is None and both.keep_default and both.winner.arm.of_trial is None
    assert both.sentence() == ("no interval for trial 3 against vLLM's default (trial 3 carried no load within the "
                               "boundary in 1 of 2 launches; vLLM's default carried no load within the boundary in "
                               "1 of 2 launches): keep vLLM's default")


def _trial(number: int, mark: ValidationMark | None, state: TrialState, capacity_rps: float | None,
           edge_rps: float | None = None) -> StoredTrial:
    m = measurement()
    score = None if state is not TrialState.COMPLETE else Score(
        m.completed_rps, m.e2e_s.p95, m.output_tps, 1.0, {}, [],
        Capacity(capacity_rps, None, None, edge_rps, 3, "bracketed"))
    return StoredTrial("demo", number, 1, state, EngineConfig(), "vllm serve m", m, None, None, None, None, None,
                       None, MACHINE, "0.32.0", "2025-01-01T00:00:00+00:00", None, score, validation=mark)


def test_validations_are_read_back_from_marked_trials_in_the_order_they_ran():
    marks = interleaved([Arm(0, None), Arm(1, 2)], 2, run=1)
    trials = [_trial(0, None, TrialState.COMPLETE, 2.0), _trial(2, None, TrialState.COMPLETE, 3.5),
              _trial(4, marks[0], TrialState.COMPLETE, 2.1), _trial(5, marks[1], TrialState.COMPLETE, 3.0),
              # stopped mid-launch: not a measurement, run again as trial 8
              _trial(6, marks[2], TrialState.STOPPED, None),
              dataclasses.replace(_trial(7, marks[3], TrialState.FAILED, None), failure_class="engine_died")]
    (v,) = validations(trials, searched=True)
    assert not v.complete and latest_validation(trials, True) is None
    assert v.default.trials == (4,) and v.arms[1].values == (3.0, 0.0)  # a failed launch carried nothing
    trials.append(_trial(8, marks[2], TrialState.COMPLETE, 2.2))
    (v,) = validations(trials, searched=True)
    # Trial 5 carried 3.0 and no load above it failed: open (None for programs); a failed launch has no bracket.
    assert v.arms[1].brackets == (math.inf, 0.0)
    assert v.complete and v.order == (4, 5, 7, 8) and v.default.values == (2.1, 2.2)
    assert latest_validation(trials, True) == v and latest_validation(trials, True, against_itself=True) is None
    assert v.to_dict()["arms"][1] == {"label": "trial 2", "of_trial": 2, "trials": [5, 7], "values": [3.0, 0.0],
                                      "median": 1.5, "failures": ["engine_died"], "brackets": [None, 0.0]}
    # A launch that failed is named as such, not only as one that carried nothing.
    assert v.sentence() == ("no interval for trial 2 against vLLM's default (trial 2 carried no load within the "
                            "boundary in 1 of 2 launches, of which 1 failed: engine_died): keep vLLM's default")


def test_a_gain_inside_the_defaults_wide_bracket_keeps_the_default():
    # The H100 validation of 2026-12-06: vLLM's default passed 16.3 req/s and failed 23.1 in both launches (its
    # probes ran out before the 10% precision), trial 3 passed 21.0 and failed 23.1. The lower ends agree
    # exactly, so the repeats alone read x1.29 beyond noise; the default's capacity may lie anywhere up to 23.1.
    marks = interleaved([Arm(0, None), Arm(1, 3)], 2, run=1)
    trials = [_trial(number, mark, TrialState.COMPLETE, rps, 23.08)
              for number, mark, rps in zip((6, 7, 8, 9), marks, (16.32, 20.98, 16.32, 20.98))]
    (v,) = validations(trials, searched=True, resolution=0.1)
    assert v.default.brackets == pytest.approx((0.414, 0.414), abs=0.001)
    gain = v.gain
    assert gain.ratio == pytest.approx(1.286, abs=0.001)
    assert (gain.low, gain.high) == pytest.approx((1.286 / 1.414, 1.286 * 1.1), abs=0.001)
    assert gain.includes_one and v.keep_default and v.winner.arm.of_trial is None
    # Brackets as narrow as the precision change nothing: the same loads, each failed 10% above, tell them apart.
    narrow = [_trial(t.trial_number, t.validation, TrialState.COMPLETE, rps, rps * 1.1)
              for t, rps in zip(trials, (16.32, 20.98, 16.32, 20.98))]
    (told,) = validations(narrow, searched=True, resolution=0.1)
    assert not told.keep_default and told.gain.low == pytest.approx(1.286 / 1.1, abs=0.001)
    # One wide launch among narrow ones widens by the launches' geometric mean, as the gain is one of capacities:
    # the default's capacities lie within 41% and 10% above their values, so their geometric mean within 25%, and
    # trial 3's (21.0, within 10%) stays above it.
    one_wide = [dataclasses.replace(narrow[0], score=trials[0].score), *narrow[1:]]
    (mixed,) = validations(one_wide, searched=True, resolution=0.1)
    widened = (23.08 / 16.32 * 1.1) ** 0.5
    assert mixed.default.bracket == pytest.approx(widened - 1)
    assert mixed.gain.low == pytest.approx(20.98 / 16.32 / widened) and not mixed.keep_default


def test_a_capacity_no_failing_load_bounded_leaves_its_side_of_the_interval_open():
    # The same loads, each failed 10% above, except one launch whose probes ran out while it still passed: its
    # capacity may lie anywhere above what it passed.
    marks = interleaved([Arm(0, None), Arm(1, 3)], 2, run=1)

    def launches(open_launch: int) -> list[StoredTrial]:
        return [_trial(number, mark, TrialState.COMPLETE, rps, None if number == open_launch else rps * 1.1)
                for number, mark, rps in zip((6, 7, 8, 9), marks, (16.32, 20.98, 16.32, 20.98))]

    (default_open,) = validations(launches(8), searched=True, resolution=0.1)
    gain = default_open.gain
    assert gain.low == 0 and gain.high == pytest.approx(1.286 * 1.1, abs=0.001)
    assert default_open.keep_default and default_open.sentence() == (
        "vLLM's default is within noise of the best configuration found (trial 3: x1.29, 95% CI 0-1.41, 2 repeats "
        "each): keep it")
    (finalist_open,) = validations(launches(9), searched=True, resolution=0.1)
    gain = finalist_open.gain
    assert gain.low == pytest.approx(1.286 / 1.1, abs=0.001) and math.isinf(gain.high)
    assert not finalist_open.keep_default and gain.text() == "x1.29, 95% CI 1.17 or more, 2 repeats each"
    assert gain.to_dict()["high"] is None
    assert finalist_open.to_dict()["arms"][1]["brackets"] == [pytest.approx(0.1), None]


def test_the_launches_are_told_one_by_one_with_where_each_bracket_ended():
    marks = interleaved([Arm(0, None), Arm(1, 3)], 2, run=1)
    edges = (23.08, 23.08, None, 23.08)  # the default's second launch passed every load it probed
    trials = [_trial(number, mark, TrialState.COMPLETE, rps, edge)
              for number, mark, rps, edge in zip((6, 7, 8, 9), marks, (16.32, 20.98, 16.32, 20.98), edges)]
    (v,) = validations(trials, searched=True, resolution=0.1)
    assert v.launches_text() == ("launch by launch, in req/s within the boundary, each with the lowest load above "
                                 "it that did not pass: vLLM's default 16.3 (23.1), 16.3 (none failed); trial 3 21 "
                                 "(23.1), 21 (23.1)")
    # At a fixed load there is no bracket to tell.
    assert _validation((2.0, 2.1), (2.9, 3.1)).launches_text() == (
        "launch by launch, in req/s within the boundary: vLLM's default 2, 2.1; trial 3 2.9, 3.1")


def test_the_paired_interval_is_the_t_interval_on_the_rounds_log_ratios():
    finalist, default = [3.0, 3.3, 2.8], [2.0, 2.1, 1.9]  # round by round
    found = gain_interval(finalist, default, paired=True)
    # By hand: the log ratios ln 1.5, ln(3.3/2.1), ln(2.8/1.9) = 0.40547, 0.45199, 0.38777 have mean 0.41507 and
    # standard deviation 0.033170; t(0.975, 2 degrees of freedom) = 4.3027, so the half-width is
    # 4.3027 * 0.033170 / sqrt(3) = 0.08240 and the interval exp(0.41507 -+ 0.08240) = 1.3947 to 1.6446.
    assert found.ratio == pytest.approx(1.5145, abs=1e-4)
    assert (found.low, found.high) == pytest.approx((1.3947, 1.6446), abs=1e-4)
    assert found.paired and found.repeats == (3, 3) and found.text() == "x1.51, 95% CI 1.39-1.64, 3 paired rounds"
    assert found.to_dict()["paired"] is True
    # The same records taken as independent launches: Welch's interval, exp(0.2465) to exp(0.5837), is wider.
    welch = gain_interval(finalist, default)
    assert (welch.low, welch.high) == pytest.approx((1.2795, 1.7926), abs=1e-4) and not welch.paired
    # A drift common to a round cancels from its ratio: every round 10% apart leaves nothing to widen by but the
    # search's resolution, where Welch's reads the rounds' spread as noise and includes 1.
    drifting = gain_interval([2.2, 3.3, 2.75], [2.0, 3.0, 2.5], resolution=0.05, paired=True)
    assert (drifting.low, drifting.high) == pytest.approx((1.1 / 1.05, 1.1 * 1.05))
    assert gain_interval([2.2, 3.3, 2.75], [2.0, 3.0, 2.5], resolution=0.05).includes_one
    with pytest.raises(ValueError, match="pairs"):
        gain_interval([2.0, 2.1, 2.2], [1.0, 1.1], paired=True)


def test_a_paired_validation_pairs_each_rounds_launches_and_a_fallback_part_way_does_not():
    marks = [dataclasses.replace(m, paired=True) for m in interleaved([Arm(0, None), Arm(1, 3)], 3, run=1)]
    capacities = (2.0, 3.0, 2.1, 3.3, 1.9, 2.8)  # default, trial 3, round by round
    trials = [_trial(number, mark, TrialState.COMPLETE, rps, rps * 1.01)
              for number, mark, rps in zip(range(6, 12), marks, capacities)]
    (v,) = validations(trials, searched=True, resolution=0.01)
    assert v.paired and v.default.rounds == (1, 2, 3) and v.to_dict()["paired"]
    assert v.gain == gain_interval([3.0, 3.3, 2.8], [2.0, 2.1, 1.9], 0.01, (v.arms[1].bracket, v.default.bracket),
                                   paired=True)
    assert v.sentence() == "trial 3 carries more than vLLM's default (x1.51, 95% CI 1.39-1.64, 3 paired rounds): " \
                           "recommended"
    # Round 3 ran as interleaved launches after the pairing fell back: no pairs then, Welch's on every launch.
    fell_back = trials[:4] + [dataclasses.replace(t, validation=dataclasses.replace(t.validation, paired=False))
                              for t in trials[4:]]
    (mixed,) = validations(fell_back, searched=True, resolution=0.01)
    assert not mixed.paired and not mixed.gain.paired and mixed.gain.text().endswith("3 repeats each")
    # How the launches ran follows the verdict on a line of its own, where the runner said.
    said = dataclasses.replace(v, design="paired on one engine pair with sleep mode")
    assert said.verdict() == v.sentence() + "\npaired on one engine pair with sleep mode"
    assert v.verdict() == v.sentence()


def test_a_mark_stored_before_pairing_came_reads_as_interleaved():
    old = {"run": 1, "round": 2, "repeats": 2, "arm": 1, "of_trial": 3}
    assert ValidationMark.from_dict(old) == ValidationMark(1, 2, 2, 1, 3) and not ValidationMark.from_dict(old).paired
    assert ValidationMark.from_dict({**old, "paired": True}).paired


def test_a_validation_pairs_on_a_gpu_with_sleep_mode_and_says_why_not_elsewhere():
    assert pairing(2, slot_gpus=1, sleep_mode=True) == Pairing(True, "")
    assert pairing(2, 1, True).text == "paired on one engine pair with sleep mode"
    assert pairing(2, 0, True).text == "interleaved launches: vLLM's CPU build has no sleep mode"
    assert pairing(2, 1, False).text == "interleaved launches: the installed vLLM serves no sleep mode endpoints"
    assert pairing(3, 1, True).text == "interleaved launches: paired validation takes two configurations, this one 3"
    assert pairing(2, 1, True, wanted=False).text == "interleaved launches: pairing turned off (--no-pairing)"
    # Begun paired: how it ran in the end.
    assert paired_design(3, 3, None) == "paired on one engine pair with sleep mode"
    assert paired_design(0, 3, "engine 2 of 2 did not start") == "interleaved launches: engine 2 of 2 did not start"
    assert paired_design(1, 3, "POST /wake_up answered 500") == (
        "paired on one engine pair with sleep mode for 1 of 3 rounds, then interleaved launches: POST /wake_up "
        "answered 500")
