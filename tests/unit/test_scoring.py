"""Scoring under a boundary, and the rule that stops a trial only once its boundary is certainly missed."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tuner.common.errors import TunerError
from tuner.search.pruning import BoundaryWatch
from tuner.traces.stats import percentile
from tuner.analysis.scoring import BOUNDARIES, Capacity, Score, boundary, parse_limits, score
from tuner.study.recommendation import capacity_sentence
from tuner.workers.measure import Measurement, measure
from tuner.workers.replay import InFlight, LiveReplay, ReplayResult
from tuner.workers.request_record import Outcome, RequestRecord


def _record(i: int, e2e: float | None, ttft: float | None = 0.1, outcome: Outcome = Outcome.OK) -> RequestRecord:
    return RequestRecord(i, 0.0, 0.0, 10, 10, 10 if outcome is Outcome.OK else 0, outcome, ttft_s=ttft, e2e_s=e2e)


def _measurement(e2es: list[float | None], duration: float = 10.0):
    records = [_record(i, e, outcome=Outcome.OK if e is not None else Outcome.DISCONNECTED) for i, e in enumerate(e2es)]
    return measure(ReplayResult(records, duration, None, None))


def test_score_objectives_and_constraints():
    m = _measurement([1.0] * 19 + [50.0])
    s = score(m, boundary("interactive"), trace_span_s=10.0)
    assert s.objectives == (pytest.approx(2.0), pytest.approx(percentile([1.0] * 19 + [50.0], 95)))
    assert s.constraints["e2e_p95_s"] == pytest.approx(s.e2e_p95_s - 30.0)
    assert s.constraints["completion_ratio"] == pytest.approx(0.99 - 1.0)
    assert s.feasible == (s.e2e_p95_s <= 30.0)


def test_a_context_that_clips_half_the_requests_carries_half_its_capacity_whole():
    # Each capacity stands for loads probed with the clipped prompts; vLLM would refuse the prompts clipped here, so
    # the study ranks by, and the answer states, the traffic carried whole.
    capacity = Capacity(4.0, 2.0, 0.5, 4.4, 4, "bracket within 10%")
    m = _measurement([1.0] * 20)
    whole = score(m, boundary("long-prompt"), 10.0, capacity)
    halved = score(m, boundary("long-prompt"), 10.0, capacity, whole_share=0.5)
    assert whole.objectives[0] == pytest.approx(4.0) and halved.objectives[0] == pytest.approx(2.0)
    assert Score.from_dict(halved.to_dict()) == halved
    assert "whole" not in capacity_sentence(whole, 2.0)
    assert capacity_sentence(halved, 2.0).startswith(
        "carries 4 req/s (x0.5 the trace's rate) within the boundary, 2 req/s of it whole (50% of the requests were "
        "clipped to its max_model_len, which vLLM would refuse)")
    fixed = score(m, boundary("long-prompt"), 10.0, whole_share=0.75)  # at a fixed load: the completed req/s
    assert fixed.carried_rps == pytest.approx(0.75 * fixed.completed_rps)


def test_failures_break_the_completion_limit():
    s = score(_measurement([1.0] * 9 + [None]), boundary("interactive"), 10.0)
    assert not s.feasible and s.completion_ratio == 0.9
    assert any("completion ratio 0.900" in v for v in s.violations)


def test_batch_boundary_limits_makespan():
    b = boundary("batch")
    assert b.makespan_limit_s(100.0) == 260.0
    s = score(_measurement([1.0] * 10, duration=300.0), b, 100.0)
    assert not s.feasible and s.constraints["makespan_s"] == pytest.approx(40.0)


def test_an_optional_time_per_output_token_limit_is_off_by_default_and_checked_when_set():
    records = [RequestRecord(i, 0.0, 0.0, 10, 10, 10, Outcome.OK, ttft_s=0.1, e2e_s=1.0,
                             itl_mean_s=0.3 if i < 5 else 0.05) for i in range(20)]
    m = measure(ReplayResult(records, 10.0, None, None))
    assert m.tpot_s.p95 == pytest.approx(0.3)
    assert all(b.tpot_p95_s is None for b in BOUNDARIES.values())
    assert score(m, boundary("interactive"), 10.0).feasible
    held = score(m, boundary("interactive", {"tpot_p95_s": 0.1}), 10.0)
    assert not held.feasible and held.constraints["tpot_p95_s"] == pytest.approx(0.2)
    assert held.violations == ["tpot_p95_s 0.300 s is over the limit 0.100 s"]


def test_the_long_prompt_boundary_lets_first_tokens_take_longer_for_longer_prompts():
    # 20 requests: prompts of 200 tokens answered in 0.4 s and of 12,000 tokens in 5 s (0.4 and 0.42 s per 1,000,
    # the short ones counted as 1,000).
    records = [RequestRecord(i, 0.0, 0.0, 10, 200 if i % 2 else 12_000, 10, Outcome.OK,
                             ttft_s=0.4 if i % 2 else 5.0, e2e_s=20.0) for i in range(20)]
    m = measure(ReplayResult(records, 10.0, None, None))
    assert m.ttft_per_1k_prompt_s.p95 == pytest.approx(5.0 / 12)
    long_prompt, interactive = boundary("long-prompt"), boundary("interactive")
    assert score(m, long_prompt, 10.0).feasible and not long_prompt.ttft_over(m)
    assert not score(m, interactive, 10.0).feasible and interactive.ttft_over(m)
    # The short prompts held to 0.5 s: at 0.6 s each, they break it.
    slow_short = [replace(r, ttft_s=0.6) if r.input_tokens == 200 else r for r in records]
    held = score(measure(ReplayResult(slow_short, 10.0, None, None)), long_prompt, 10.0)
    assert held.violations == ["ttft_per_1k_prompt_p95_s 0.600 s is over the limit 0.500 s"]
    assert Measurement.from_dict(m.to_dict()) == m


def test_the_watch_allows_a_long_prompt_its_longer_first_token():
    watch = BoundaryWatch(boundary("long-prompt"))
    long_in_flight = _live(20, [], in_flight_ages=[5.0, 5.0])
    for p in long_in_flight.in_flight.values():
        p.input_tokens = 12_000  # allowed 6 s
    assert watch(long_in_flight) is None
    short = _live(20, [], in_flight_ages=[5.0, 5.0])  # 10 tokens: allowed 0.5 s
    assert watch(short) == "2 requests already waited over 0.5 s per 1,000 prompt tokens for a first token: " \
                           "p95 cannot meet it"


def test_limits_override_and_are_checked():
    b = boundary("interactive", parse_limits(["ttft_p95_s=0.5", "e2e_p95_s=none"]))
    assert b.ttft_p95_s == 0.5 and b.e2e_p95_s is None and BOUNDARIES["interactive"].ttft_p95_s == 2.0
    with pytest.raises(TunerError, match="unknown boundary limit 'p42'"):
        boundary("interactive", {"p42": 1.0})
    with pytest.raises(TunerError, match="must be positive"):
        boundary("interactive", {"ttft_p95_s": -1.0})
    with pytest.raises(TunerError, match="unknown boundary 'fast'"):
        boundary("fast")
    with pytest.raises(TunerError, match="expects a number"):
        parse_limits(["ttft_p95_s=soon"])


def _live(total: int, finished: list[RequestRecord], in_flight_ages: list[float] = (), now: float = 100.0):
    live = LiveReplay(origin=0.0, total=total, finished=finished)
    live.in_flight = {1000 + i: InFlight(sent=now - age, input_tokens=10) for i, age in enumerate(in_flight_ages)}
    live.elapsed = lambda: now  # a frozen clock
    return live


def test_watch_stops_once_p95_cannot_be_met():
    watch = BoundaryWatch(boundary("interactive", {"ttft_p95_s": None}))
    # 20 requests: p95 interpolates between ranks 18 and 19 (0-based), so 2 over the limit decide it.
    assert watch(_live(20, [_record(0, 31.0)])) is None
    assert "p95 cannot meet it" in watch(_live(20, [_record(0, 31.0), _record(1, 40.0)]))
    # One over, one still in flight past the limit: with 20 requests the 1% failure budget is 0, so that one
    # cannot fail instead; it will finish over the limit.
    assert watch(_live(20, [_record(0, 31.0)], in_flight_ages=[35.0])) is not None


def test_watch_counts_failures_against_completion():
    watch = BoundaryWatch(boundary("interactive", {"min_completion_ratio": 0.9}))
    two_failed = [_record(0, None, outcome=Outcome.HTTP_ERROR), _record(1, None, outcome=Outcome.TIMEOUT)]
    assert watch(_live(20, two_failed)) is None  # 2 of 20 may fail
    third = _record(2, None, outcome=Outcome.HTTP_ERROR)
    assert "completion ratio cannot reach" in watch(_live(20, two_failed + [third]))


def test_watch_never_stops_a_trial_that_could_still_be_feasible():
    """Property: whenever the watch says stop, every completion of the replay is infeasible."""
    rng = random.Random(7)
    b = boundary("interactive", {"ttft_p95_s": None, "e2e_p95_s": 5.0, "min_completion_ratio": 0.9})
    watch = BoundaryWatch(b)
    stopped = 0
    for _ in range(400):
        total = rng.randint(5, 40)
        n_done = rng.randint(0, total)
        done = [_record(i, rng.choice([1.0, 4.9, 6.0, None])) for i in range(n_done)]
        done = [r if r.e2e_s is not None else _record(r.index, None, outcome=Outcome.HTTP_ERROR) for r in done]
        ages = [rng.choice([1.0, 6.0]) for _ in range(rng.randint(0, total - n_done))]
        if watch(_live(total, done, ages)) is None:
            continue
        stopped += 1
        # The kindest ending: in-flight requests finish at their age, or fail if that helps; the rest are fast.
        rest = total - n_done - len(ages)
        for fail_k in range(len(ages) + 1):
            ends = [r.e2e_s for r in done] + [None] * fail_k + sorted(ages)[: len(ages) - fail_k] + [0.1] * rest
            finished = [e for e in ends if e is not None]
            feasible = (len(finished) / total >= 0.9) and finished and percentile(finished, 95) <= 5.0
            assert not feasible
    assert stopped > 20  # the property was exercised
