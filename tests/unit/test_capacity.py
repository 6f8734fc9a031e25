"""The load search, without an engine: probes judged from request records, the next load chosen from verdicts,
capacities summed up, the trace repeated for a probe, and the policy's bad values refused."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from tests.factories import study_settings
from tuner.analysis.capacity import (DECISIVE_REQUESTS, JudgedProbe, LoadPolicy, LoadSearch, ProbeLength, Verdict,
                                     capacity_of, judge_probe, served_alone, wilson_interval)
from tuner.common.errors import TunerError
from tuner.common.paths import bundled_trace
from tuner.analysis.scoring import (STEADY_CARRIED, STEADY_SHORTFALL_MIN, STEADY_SHORTFALL_SHARE, STEADY_TREND,
                                    boundary, pace_undecided, pace_violations, score)
from tuner.storage import StudySettings
from tuner.traces.records import Trace, TraceRequest
from tuner.traces.transforms import repeat
from tuner.workers.measure import Pace, measure
from tuner.workers.probes import FixedLoad, Probe, ProbeRun, probe_trace
from tuner.workers.replay import ReplayResult
from tuner.workers.request_record import Outcome, RequestRecord

LIFTED = boundary("interactive", {"ttft_p95_s": None, "e2e_p95_s": None})
DATA = Path(__file__).parents[1] / "data"


def _records(n: int, gap_s: float, e2e_s: float | list[float], ttft_s: float = 0.05) -> list[RequestRecord]:
    """n requests due `gap_s` apart, each sent on time and served in full in `e2e_s` (one value, or one each)."""
    latencies = e2e_s if isinstance(e2e_s, list) else [e2e_s] * n
    return [RequestRecord(i, i * gap_s, i * gap_s, 16, 100, 16, Outcome.OK, ttft_s=ttft_s, e2e_s=latencies[i],
                          itl_mean_s=0.01) for i in range(n)]


def _run(records: list[RequestRecord], factor: float = 1.0, index: int = 0, period: int | None = None,
         **probe) -> ProbeRun:
    """A probe of these requests; `period`: the requests of one copy of the trace, where the probe repeats it."""
    duration = max(r.sent_s + r.e2e_s for r in records)
    m = measure(ReplayResult(records, duration, None, None), period)
    return ProbeRun(Probe(index, factor, index, len(records), m, **probe), records)


def test_a_probe_that_keeps_up_within_the_boundary_passes():
    run = _run(_records(100, 0.1, 0.5))
    assert judge_probe(run.probe, run.records, boundary("interactive")).verdict is Verdict.PASS


def test_a_queue_that_grows_fails_as_not_kept_up_even_with_latency_limits_lifted():
    # Each request waits behind every one before it: the engine serves one every 0.2 s while they come every 0.1 s.
    records = _records(100, 0.1, [0.2 * (i + 1) - 0.1 * i for i in range(100)])
    run = _run(records)
    judgement = judge_probe(run.probe, run.records, LIFTED)
    assert judgement.verdict is Verdict.FAIL
    assert any("did not keep up" in r for r in judgement.reasons)


def test_one_pause_of_the_machine_near_the_end_is_no_queue_that_grows():
    # A steady engine (0.5 s a request, 80 requests over 29.2 s as in a probe) and one 5 s pause from 26 s: every
    # request due or in flight then finishes at its end. Too many finish late for the shortfall alone, but the
    # latency did not grow through the probe.
    records = [replace(r, e2e_s=31.0 - r.scheduled_s) if 25.5 <= r.scheduled_s <= 31.0 else r
               for r in _records(80, 0.37, 0.5)]
    run = _run(records)
    pace = run.probe.measurement.pace
    assert pace.steady_shortfall > max(STEADY_SHORTFALL_MIN, STEADY_SHORTFALL_SHARE * pace.steady_arrivals)
    assert pace.e2e_trend < STEADY_TREND
    assert judge_probe(run.probe, run.records, LIFTED).verdict is Verdict.PASS


def test_a_repeated_trace_whose_later_requests_are_longer_is_no_queue_that_grows():
    # Two copies of a 30-request trace whose last third asks for long outputs (2 s against 0.3 s): the probe's last
    # third of requests is slower than its first third (x2.5) and some finish late, though the engine served every
    # span one copy long in full. The trend alone failed it; the same requests' copies show no queue.
    latencies = [0.3 if j < 10 else 0.8 if j < 20 else 2.0 for j in range(30)] * 2
    alone = Pace.of(_records(60, 0.1, latencies))
    assert alone.e2e_trend > STEADY_TREND and alone.carried_share is None and pace_violations(alone)
    run = _run(_records(60, 0.1, latencies), period=30)
    pace = run.probe.measurement.pace
    assert pace.carried_share >= STEADY_CARRIED and pace.steady_shortfall == alone.steady_shortfall
    assert judge_probe(run.probe, run.records, LIFTED).verdict is Verdict.PASS


def test_a_queue_that_grows_in_a_repeated_trace_fails_on_what_each_copy_long_span_served():
    # Three copies of 30 requests due 0.1 s apart, each request waiting 0.3 s more per second of the probe: the
    # engine serves 1/1.3 of what arrives, and each span one copy long shows it.
    run = _run(_records(90, 0.1, [0.3 + 0.03 * i for i in range(90)]), period=30)
    pace = run.probe.measurement.pace
    assert pace.carried_share == pytest.approx(1 / 1.3, abs=0.02)
    judgement = judge_probe(run.probe, run.records, LIFTED)
    assert judgement.verdict is Verdict.FAIL
    assert judgement.reasons == [pace_violations(pace)[0]]
    assert judgement.reasons[0].endswith("in a span as long as one copy of the trace, it served 77% of the requests "
                                         "one copy brings")


def test_vllms_default_on_an_h100_kept_up_with_the_azure_trace_whose_later_requests_are_longer():
    # vLLM's default (Llama-3.1-8B, dummy weights) on an H100 on 2026-12-05, at 17.6 and 16.2 req/s: two copies of
    # the bundled cut's first 300 requests, whose last third asks for 388 output tokens (median) against 183 for
    # the first. The trend (x1.55, x1.59) and the late requests failed both; each span one copy long served the
    # whole copy, and the same requests took as long in either copy.
    for probe, factor in ((2, 1.41), (4, 1.29)):
        run = _h100_probe(probe, "h100-default-kept-up.csv", factor)
        pace = run.probe.measurement.pace
        assert pace.e2e_trend > STEADY_TREND and pace_violations(replace(pace, carried_share=None))
        assert pace.carried_share == 1.0
        assert judge_probe(run.probe, run.records, boundary("interactive")).verdict is Verdict.PASS


def test_a_burst_far_beyond_the_engine_fails_though_its_batch_makes_early_and_late_requests_alike():
    # 32 requests in 1.2 s that the engine's batch takes in at once and finishes together 5 s later: the median
    # latency does not grow, but most requests are late (as vLLM's default did at three times what it carries).
    run = _run(_records(32, 0.038, [5.0 - i * 0.038 for i in range(32)]))
    pace = run.probe.measurement.pace
    assert pace.e2e_trend < STEADY_TREND and pace.steady_shortfall > 0.5 * pace.steady_arrivals
    judgement = judge_probe(run.probe, run.records, LIFTED)
    assert judgement.verdict is Verdict.FAIL and judgement.reasons[0].startswith("did not keep up: of ")


def test_a_percentile_within_noise_of_its_limit_is_inconclusive_and_far_over_it_fails():
    bound = boundary("interactive", {"ttft_p95_s": None, "e2e_p95_s": 1.0})
    # 3 of 100 over the limit: p95 is under it, but the share within it (0.97) cannot be told from 0.95.
    near = _run(_records(100, 0.1, [2.0 if i % 33 == 0 else 0.5 for i in range(100)]))
    judgement = judge_probe(near.probe, near.records, bound)
    assert judgement.verdict is Verdict.INCONCLUSIVE
    assert "within noise" in judgement.reasons[0]
    far = _run(_records(100, 0.1, [2.0 if i % 5 == 0 else 0.5 for i in range(100)]))
    assert judge_probe(far.probe, far.records, bound).verdict is Verdict.FAIL


def test_a_probe_is_judged_on_ttft_per_prompt_request_by_request_under_the_long_prompt_boundary():
    # 100 prompts of 12,000 tokens, their first tokens in 4 s (0.33 s per 1,000): a flat 2 s limit fails them all.
    run = _run([replace(r, input_tokens=12_000) for r in _records(100, 0.1, 5.0, ttft_s=4.0)])
    assert judge_probe(run.probe, run.records, boundary("long-prompt")).verdict is Verdict.PASS
    assert judge_probe(run.probe, run.records, boundary("interactive", {"e2e_p95_s": None})).verdict is Verdict.FAIL
    slow = _run([replace(r, input_tokens=12_000) for r in _records(100, 0.1, 8.0, ttft_s=7.0)])
    judgement = judge_probe(slow.probe, slow.records, boundary("long-prompt"))
    assert judgement.verdict is Verdict.FAIL and "ttft_per_1k_prompt_p95_s" in judgement.reasons[0]


def test_arrivals_that_end_before_the_early_requests_are_served_cannot_show_the_pace():
    # An engine overloaded from the first second, as a tight KV budget was on a crowded machine (5.3 s of arrivals,
    # the early requests' p90 latency 23.4 s): every request waits about as long as those before it, so neither
    # pace rule sees a queue that grows, and the probe passed five times what that engine carries.
    run = _run(_records(144, 0.037, [20.0 + 0.02 * i for i in range(144)]))
    pace = run.probe.measurement.pace
    assert not pace_violations(pace) and pace.lag_s > pace.window_s
    judgement = judge_probe(run.probe, run.records, LIFTED)
    assert judgement.verdict is Verdict.INCONCLUSIVE
    assert judgement.reasons == [pace_undecided(pace)]
    assert judgement.reasons[0].startswith("too short to tell whether the engine kept up: the arrivals lasted 5.3 s")
    # At the reference load the search goes on below it, and the trial is not within the boundary at your traffic.
    assert _search().next_factor([run]) < 1.0
    scored = score(run.probe.measurement, LIFTED, pace.window_s, judge_pace=True)
    assert not scored.feasible and scored.violations == judgement.reasons
    # The same arrivals served in 2 s each show the pace: the probe passes, the trial is feasible.
    quick = _run(_records(144, 0.037, 2.0))
    assert judge_probe(quick.probe, quick.records, LIFTED).verdict is Verdict.PASS
    assert score(quick.probe.measurement, LIFTED, pace.window_s, judge_pace=True).feasible


def _h100_probe(number: int, data: str = "h100-default-probes.csv", factor: float | None = None) -> ProbeRun:
    """A probe of vLLM's default (Llama-3.1-8B, dummy weights) on an H100, the bundled cut's first 300 requests
    repeated, as recorded on 2026-12-05. h100-default-probes.csv: probe 0 at the reference load (12.5 req/s), probe 1
    at twice it (600 requests at 25 req/s); h100-default-kept-up.csv: probes 2 and 4 of a later search, at 17.6 and
    16.2 req/s. `factor`: the probe's load against the reference; 2 to the probe's number by default."""
    with (DATA / data).open() as f:
        rows = [row for row in csv.DictReader(f) if int(row["probe"]) == number]
    records = [RequestRecord(i, float(r["scheduled_s"]), float(r["sent_s"]), int(r["output_tokens"]),
                             int(r["input_tokens"]), int(r["output_tokens"]), Outcome.OK, ttft_s=float(r["ttft_s"]),
                             e2e_s=float(r["e2e_s"])) for i, r in enumerate(rows)]
    return _run(records, factor=2.0 ** number if factor is None else factor, index=number, period=300)


def test_early_requests_slow_for_half_the_window_cannot_show_the_pace_when_many_later_ones_are_late():
    # vLLM's default on an H100 passed 25 req/s of the Azure trace in a 24 s probe: the early requests' p90 latency
    # was 16.8 s, so 149 of the 423 later requests finishing after it, with the median latency up x1.25, broke
    # neither pace rule. That engine never completed more than 22 req/s, and a longer replay at 32 req/s fell
    # behind (p95 TTFT 11.7 s, 263 waiting): 25 req/s was no capacity.
    run = _h100_probe(1)
    pace = run.probe.measurement.pace
    assert (pace.window_s, pace.lag_s) == (pytest.approx(24.05, abs=0.01), pytest.approx(16.78, abs=0.01))
    assert (pace.steady_arrivals, pace.steady_completed) == (423, 274) and pace.e2e_trend < STEADY_TREND
    assert not pace_violations(pace) and pace.lag_s < pace.window_s
    # Its first requests took longer than a copy of the trace (12 s): no span one copy long came after them.
    assert pace.carried_share is None
    judgement = judge_probe(run.probe, run.records, boundary("interactive"))
    assert judgement.verdict is Verdict.INCONCLUSIVE and judgement.reasons == [pace_undecided(pace)]
    assert judgement.reasons[0].startswith("too short to tell whether the engine kept up: the early requests' p90 "
                                           "latency (16.78 s) was more than half of the 24.0 s")
    # The search takes it as the bracket's upper edge: the capacity is looked for between the two loads.
    reference = _h100_probe(0)
    assert judge_probe(reference.probe, reference.records, boundary("interactive")).verdict is Verdict.PASS
    assert 1.0 < _search(precision=0.1).next_factor([reference, run]) < 2.0
    # Early requests that took half the window but left few later ones late still show a pace kept.
    steady = _run(_records(240, 0.1, 13.0))
    assert steady.probe.measurement.pace.lag_s > 0.5 * steady.probe.measurement.pace.window_s
    assert judge_probe(steady.probe, steady.records, LIFTED).verdict is Verdict.PASS


def test_wilson_interval_needs_about_75_requests_all_within_a_limit_to_pass_a_p95():
    assert wilson_interval(72, 72)[0] < 0.95 <= wilson_interval(74, 74)[0]
    lo, hi = wilson_interval(50, 100)
    assert lo < 0.5 < hi


def test_a_probe_stopped_early_or_whose_engine_died_fails():
    stopped = _run(_records(20, 0.1, 0.5), stop_reason="2 requests already waited over 2 s")
    assert judge_probe(stopped.probe, stopped.records, LIFTED).verdict is Verdict.FAIL
    died = _run(_records(20, 0.1, 0.5), engine_lost=True)
    assert judge_probe(died.probe, died.records, LIFTED).reasons == ["the engine died during the probe"]


def test_a_probe_cut_by_its_verdict_fails_with_the_reason_and_the_search_goes_on_below():
    cut = _run(_records(20, 0.1, 0.5), cut_by_verdict="9 requests already waited over 2 s for a first token")
    judged = JudgedProbe.of(cut, LIFTED)
    assert (judged.verdict, judged.reasons) == (Verdict.FAIL, ["cut by its verdict: 9 requests already waited over "
                                                               "2 s for a first token"])
    assert JudgedProbe.from_dict(judged.to_dict()) == judged
    # A search below a failing reference goes on below it: a cut is a failed probe, not a hopeless trial.
    below = LoadSearch(LoadPolicy(), LIFTED, below_reference=True)
    assert below.next_factor([cut]) is not None and below.next_factor([cut]) < 1.0
    # A probe stored before cuts came reads back as one that ran to its end.
    stored = {k: v for k, v in judged.to_dict().items() if k != "cut_by_verdict"}
    assert JudgedProbe.from_dict(stored).probe.cut_by_verdict is None


def _search(**policy) -> LoadSearch:
    return LoadSearch(LoadPolicy(**policy), LIFTED)


def test_the_search_starts_at_the_reference_then_doubles_then_bisects_to_the_precision():
    search = _search(probe_budget=10, precision=0.1)
    assert search.next_factor([]) == 1.0
    assert search._next([(1.0, True)], None) == 2.0
    assert search._next([(1.0, True), (2.0, True)], None) == 4.0
    nxt = search._next([(1.0, True), (2.0, True), (4.0, False)], None)
    assert nxt == pytest.approx(2 ** 1.5)
    assert search._next([(1.0, True), (2.0, True), (2.1, False)], None) is None  # within 10%


def test_the_search_stops_below_a_failing_reference_unless_asked_to_go_on():
    assert _search()._next([(1.0, False)], 0.3) is None
    below = LoadSearch(LoadPolicy(), LIFTED, below_reference=True)
    assert below._next([(1.0, False)], 0.3) == pytest.approx(0.3)  # straight to what the engine carried
    assert below._next([(1.0, False)], 0.9) == 0.5  # never less than halving
    assert below._next([(1.0, False)], 0.001) == 1 / 16  # nor more than a 16th at once


def test_below_a_failing_reference_the_search_goes_down_as_far_as_the_machine_needs():
    # The demo's traffic on a machine ten times slower: each probe fails, the next goes to what it carried or half.
    below = LoadSearch(LoadPolicy(probe_budget=20), LIFTED, below_reference=True)
    results, factor = [(1.0, False)], 1.0
    while (factor := below._next(results, factor / 3)) is not None and factor > 0.02:
        results.append((factor, False))
    assert factor is not None and factor < 1 / 16  # past the old floor, a 16th of the reference
    assert LoadPolicy().min_factor == 1 / 256
    assert below._next([(1.0, False), (1 / 256, False)], None) is None  # the floor still holds


def test_a_probe_that_fails_with_its_requests_served_one_at_a_time_ends_the_search_below():
    bound = boundary("interactive", {"ttft_p95_s": None, "e2e_p95_s": 1.0})
    search = LoadSearch(LoadPolicy(probe_budget=10), bound, below_reference=True)
    crowded = _run(_records(100, 0.1, 3.0))  # 30 in flight at once: a lower load may pass
    assert not served_alone(crowded.probe) and search.next_factor([crowded]) is not None
    alone = _run(_records(100, 10.0, 3.0), 0.01, 1)  # one every 10 s, each 3 s: never two at once, and still slow
    assert served_alone(alone.probe) and search.next_factor([crowded, alone]) is None
    cap = capacity_of([JudgedProbe.of(run, bound) for run in (crowded, alone)], LoadPolicy(probe_budget=10), 1.0)
    assert cap.factor is None and "served about one at a time: the boundary is beyond this engine" in cap.ended


def test_a_reference_load_within_noise_of_its_limit_is_searched_below_for_a_load_surely_carried():
    bound = boundary("interactive", {"ttft_p95_s": None, "e2e_p95_s": 1.0})
    near = _run(_records(100, 0.1, [2.0 if i % 33 == 0 else 0.5 for i in range(100)]))  # 97 of 100 within
    search = LoadSearch(LoadPolicy(), bound)
    assert search.next_factor([near]) == 0.5
    passed = _run(_records(100, 0.2, 0.5), 0.5, 1)
    assert search.next_factor([near, passed]) == pytest.approx(0.5 ** 0.5)
    cap = capacity_of([JudgedProbe.of(run, bound) for run in (near, passed)], LoadPolicy(probe_budget=2), 1.0)
    assert cap.factor == 0.5 and cap.ended.endswith("was inconclusive")
    far = _run(_records(100, 0.1, [2.0 if i % 5 == 0 else 0.5 for i in range(100)]))  # a failure: no search below
    assert search.next_factor([far]) is None


def test_a_new_configuration_is_first_probed_at_the_best_capacity_so_far():
    search = LoadSearch(LoadPolicy(), LIFTED, best_factor=3.0)
    assert search._next([(1.0, True)], None) == 3.0
    assert search._next([(1.0, True), (3.0, False)], None) is None  # cannot beat it
    assert search._next([(1.0, True), (3.0, True)], None) == 6.0


def test_a_validation_launch_probes_its_earlier_capacity_then_the_step_beside_it():
    search = LoadSearch(LoadPolicy(precision=0.25), LIFTED, below_reference=True, start_factor=6.0)
    assert search._next([(1.0, True)], None) == 6.0
    # As found before: passes there, fails one step above, and the bracket is settled in two probes.
    assert search._next([(1.0, True), (6.0, True)], None) == pytest.approx(7.5)
    assert search._next([(1.0, True), (6.0, True), (7.5, False)], None) is None
    # Carries more this time: up from the step above, by doubling as usual.
    assert search._next([(1.0, True), (6.0, True), (7.5, True)], None) == 15.0
    # Carries less: one step below, then bisection between the reference and what failed.
    assert search._next([(1.0, True), (6.0, False)], None) == pytest.approx(4.8)
    assert search._next([(1.0, True), (6.0, False), (4.8, True)], None) is None
    assert search._next([(1.0, True), (6.0, False), (4.8, False)], None) == pytest.approx(4.8 ** 0.5)
    # Below a failing reference as well, and a step down that lands back on the same float up to rounding.
    low = LoadSearch(LoadPolicy(precision=0.1), LIFTED, below_reference=True, start_factor=0.3)
    assert low._next([(1.0, False)], 0.9) == 0.3
    assert low._next([(1.0, False), (0.3, False)], 0.9) == pytest.approx(0.3 / 1.1)
    assert low._next([(1.0, False), (0.3, False), (0.3 / 1.1, True)], 0.9) is None


def test_a_start_outside_the_bracket_or_the_load_range_is_not_probed():
    search = LoadSearch(LoadPolicy(max_factor=4.0), LIFTED, start_factor=8.0)
    assert search._next([(1.0, True)], None) == 2.0  # beyond the range: the usual doubling
    inside = LoadSearch(LoadPolicy(), LIFTED, start_factor=3.0)
    assert inside._next([(1.0, True), (2.0, False)], None) == pytest.approx(2 ** 0.5)  # already above what failed


def test_a_validation_launch_may_spend_twice_the_probe_budget():
    policy = LoadPolicy(probe_budget=2)
    assert policy.for_launch(validation=False) is policy
    assert policy.for_launch(validation=True) == LoadPolicy(probe_budget=4)
    runs = [_run(_records(100, 0.1, 0.5), 1.0), _run(_records(100, 0.05, 0.5), 2.0, 1)]
    assert LoadSearch(policy, LIFTED).next_factor(runs) is None  # the study's budget spent
    assert LoadSearch(policy.for_launch(validation=True), LIFTED).next_factor(runs) == 4.0


def test_the_probe_budget_and_the_load_range_bound_the_search():
    search = _search(probe_budget=2, max_factor=2.0)
    runs = [_run(_records(100, 0.1, 0.5), 1.0), _run(_records(100, 0.05, 0.5), 2.0, 1)]
    assert search.next_factor(runs) is None  # budget spent
    assert _search(max_factor=2.0)._next([(1.0, True), (2.0, True)], None) is None


def test_capacity_is_the_highest_passing_load_with_how_the_search_ended():
    judged = [JudgedProbe.of(_run(_records(100, 0.1, 0.5), 1.0), LIFTED),
              JudgedProbe.of(_run(_records(100, 0.05, 0.3), 2.0, 1), LIFTED),
              JudgedProbe.of(_run(_records(100, 0.025, [0.1 * i for i in range(100)]), 4.0, 2), LIFTED)]
    assert [j.verdict for j in judged] == [Verdict.PASS, Verdict.PASS, Verdict.FAIL]
    cap = capacity_of(judged, LoadPolicy(probe_budget=3), reference_scale=10.0)
    assert cap.factor == 2.0 and cap.rate_scale == 20.0
    assert cap.rps == pytest.approx(judged[1].probe.offered_rps)
    assert cap.edge_rps == pytest.approx(judged[2].probe.offered_rps)
    assert cap.ended == "probe budget of 3 spent"
    below = capacity_of(judged, LoadPolicy(), 10.0, best_factor=4.0, best_rps=40.0)
    assert below.ended == "below the best so far (< 40 req/s)"
    again = JudgedProbe.from_dict(judged[2].to_dict())
    assert again == judged[2]


def test_a_probe_trace_is_repeated_to_the_reference_length_with_prefixes_shared_only_within_a_copy():
    trace = Trace("t", "native", "0" * 64, tuple(TraceRequest(i * 1.0, 100, 10, (i % 2,)) for i in range(4)))
    faster = probe_trace(trace, 2.0, 10, 0.0)
    # 4 requests over 1.5 s at twice the rate: repeated to 3 copies (12 >= 10 requests) and >= 3 s.
    assert len(faster.requests) == 12 and faster.span_s >= trace.span_s
    assert faster.transformations[-1].kind == "repeat"
    gaps = {round(b.arrival_s - a.arrival_s, 9) for a, b in zip(faster.requests, faster.requests[1:])}
    assert gaps == {0.5}  # the rate is kept across copies
    assert [r.prefix_blocks for r in faster.requests[:6]] == [(0,), (1,), (0,), (1,), (2,), (3,)]
    assert repeat(trace, 3, 0.0) is trace  # long enough already


def test_a_burst_shorter_than_the_probe_duration_is_repeated_until_its_arrivals_last_that_long():
    # 4 requests within 0.3 s: a burst that ends before one request could finish. A search's probes last the
    # policy's seconds (20 by default) whatever the trace's span; a fixed load replays the trace as selected.
    burst = Trace("t", "native", "0" * 64, tuple(TraceRequest(i * 0.1, 100, 10) for i in range(4)))
    plan = LoadPolicy().plan(LIFTED)
    assert plan.min_span_s == 20.0 and FixedLoad().min_span_s == 0.0
    probed = probe_trace(burst, 1.0, plan.min_requests, plan.min_span_s)
    # A copy every 0.4 s, the rate kept: 51 copies, the fewest that last 20 s.
    assert len(probed.requests) == 4 * 51 and probed.span_s == pytest.approx(20.3)
    faster = probe_trace(burst, 4.0, plan.min_requests, plan.min_span_s)
    assert len(faster.requests) == 4 * 201 and faster.span_s == pytest.approx(20.075)


def test_a_study_stored_before_probes_had_a_duration_keeps_probes_as_long_as_its_trace():
    stored = LoadPolicy().to_dict()
    del stored["probe_seconds"]
    assert LoadPolicy.from_dict(stored).probe_seconds == 0.0
    assert LoadPolicy.from_dict(LoadPolicy(probe_seconds=5.0).to_dict()).probe_seconds == 5.0


def test_a_fixed_load_is_one_probe_at_the_reference():
    assert FixedLoad().next_factor([]) == 1.0
    assert FixedLoad().next_factor([_run(_records(4, 0.1, 0.5))]) is None
    assert isinstance(LoadPolicy.fixed().plan(LIFTED), FixedLoad)


@pytest.mark.parametrize("options, message", [
    (dict(mode="adaptive"), "load must be one of search, fixed"),
    (dict(precision=0), "precision must be between 0 and 1"),
    (dict(probe_budget=0), "probe budget must be at least 1"),
    (dict(load_range="2:8"), "load bounds must hold the reference load"),
    (dict(load_range="fast"), "load range must be MIN:MAX"),
    (dict(probe_requests=0), "probe requests must be at least 1"),
    (dict(probe_seconds=-1.0), "probe seconds must be at least 0"),
    (dict(probe_seconds=float("inf")), "probe seconds must be at least 0"),
])
def test_bad_load_options_are_one_line_errors(options, message):
    values = dict(mode="search", precision=0.1, probe_budget=6, load_range=None, probe_requests=100,
                  probe_seconds=20.0) | options
    with pytest.raises(TunerError, match=message):
        LoadPolicy.from_options(**values)


def test_a_study_stored_before_load_searches_runs_at_a_fixed_load():
    data = study_settings().to_dict()
    del data["load"]
    assert StudySettings.from_dict(data).load == LoadPolicy.fixed()
    searched = study_settings(load=LoadPolicy(precision=0.2))
    assert StudySettings.from_dict(searched.to_dict()).load.precision == 0.2


def test_a_searching_study_names_capacity_as_its_first_objective_for_the_dashboard(tiny_model, tmp_path):
    from tuner.study.create import create_study
    from tuner.study.plan import StoragePlan, load_optuna_study
    from tuner.traces.selection import TraceSelection

    plan = StoragePlan.resolve(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    for name, load in (("searched", LoadPolicy()), ("fixed", LoadPolicy.fixed())):
        create_study(name, model=tiny_model, trace_path=bundled_trace(), space="cpu-small",
                     boundary_name="interactive", limits={}, plan=plan, load=load,
                     selection=TraceSelection(max_requests=8, fit="clip"))
    assert load_optuna_study("searched", plan).metric_names == ["capacity_rps", "e2e_p95_s"]
    assert load_optuna_study("fixed", plan).metric_names == ["completed_rps", "e2e_p95_s"]
    assert plan.repository().get_study("searched").load == LoadPolicy()


def test_a_search_whose_reference_probe_could_never_pass_a_p95_limit_is_refused():
    # 73 requests all within a limit are the fewest whose 95% interval clears the p95; 72 are not.
    assert DECISIVE_REQUESTS == 73
    assert wilson_interval(73, 73)[0] >= 0.95 > wilson_interval(72, 72)[0]
    short = LoadPolicy(probe_requests=32)
    with pytest.raises(TunerError, match="needs at least 73 requests a probe, and one at the reference load would "
                                         "hold 32"):
        short.refuse_undecidable(boundary("interactive"), trace_requests=16, trace_span_s=6.0)
    # The trace alone holds enough.
    short.refuse_undecidable(boundary("interactive"), trace_requests=80, trace_span_s=30.0)
    short.refuse_undecidable(LIFTED, trace_requests=16, trace_span_s=6.0)  # no percentile to decide
    LoadPolicy(mode="fixed", probe_requests=32).refuse_undecidable(boundary("interactive"), trace_requests=16,
                                                                   trace_span_s=6.0)
    LoadPolicy().refuse_undecidable(boundary("interactive"), trace_requests=16, trace_span_s=6.0)  # the default's 80


def test_a_search_on_requests_that_all_arrive_at_once_is_refused():
    with pytest.raises(TunerError, match="its 8 requests all arrive at once: give a trace whose requests arrive "
                                         "over time, or --load fixed"):
        LoadPolicy().refuse_undecidable(LIFTED, trace_requests=8, trace_span_s=0.0)
    LoadPolicy.fixed().refuse_undecidable(LIFTED, trace_requests=8, trace_span_s=0.0)  # one replay, as it is


def test_a_studys_probe_length_is_its_probe_at_the_reference_load_the_least_of_the_others_and_its_budget():
    # 16 requests over 6 s: one copy and a mean gap last 6.4 s, so 20 s of arrivals take 4 copies (64 requests over
    # 3 x 6.4 + 6 = 25.2 s), more than the 3 copies that 40 requests would.
    trace = Trace("synthetic", "native", "0" * 64, tuple(TraceRequest(i * 0.4, 16, 8) for i in range(16)))
    policy = LoadPolicy(probe_requests=40, probe_seconds=20.0, probe_budget=3)
    searched = ProbeLength.of(trace, policy, boundary("batch"))
    assert (searched.requests, searched.probes) == (64, 3)
    assert searched.arrival_s == pytest.approx(25.2) and searched.offered_rps == pytest.approx(64 / 25.2)
    assert searched.least_arrival_s == 20.0 and searched.trial_arrival_s == pytest.approx(25.2 + 2 * 20.0)
    # Every other probe lasts at least that long, at higher loads and lower ones alike.
    for factor in (0.25, 0.5, 0.9, 1.1, 2.0, 3.0, 16.0):
        assert probe_trace(trace, factor, 40, 20.0).span_s >= searched.least_arrival_s
    # 80 requests take 5 copies, 31.6 s at the reference load; at twice the load 7 copies of 3.2 s reach 20 s first.
    many = ProbeLength.of(trace, replace(policy, probe_requests=80), boundary("batch"))
    assert many.arrival_s == pytest.approx(31.6) and many.least_arrival_s == 20.0
    assert probe_trace(trace, 2.0, 80, 20.0).span_s == pytest.approx(22.2)
    fixed = ProbeLength.of(trace, LoadPolicy.fixed(), boundary("batch"))
    assert (fixed.requests, fixed.arrival_s, fixed.probes, fixed.trial_arrival_s) == (16, pytest.approx(6.0), 1,
                                                                                      pytest.approx(6.0))
