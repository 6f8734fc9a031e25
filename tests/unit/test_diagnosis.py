"""The limiting resource, named from vLLM's figures at the load where a trial stops meeting its boundary."""

from __future__ import annotations

from dataclasses import replace

from tuner.analysis.capacity import JudgedProbe, Verdict
from tuner.analysis.diagnosis import EngineCaps, Limit, diagnose, edge_probe, limiting_resource
from tuner.analysis.scoring import BOUNDARIES
from tuner.common.hardware import HardwareInfo
from tuner.workers.measure import Measurement, Percentiles, measure
from tuner.workers.probes import Probe
from tuner.workers.replay import ReplayResult
from tuner.workers.request_record import Outcome, RequestRecord
from tuner.workers.server_metrics import TimelineSample

CAPS = EngineCaps(max_num_seqs=16, max_num_batched_tokens=2048, source="set")
H200 = HardwareInfo("cuda", "NVIDIA H200", 139.8, 1, "cpu", 16, 128.0)


def _m(rps: float = 4.0, offered: float = 5.0, **figures) -> Measurement:
    records = [RequestRecord(i, 0.0, 0.0, 10, 10, 10, Outcome.OK, ttft_s=0.1, e2e_s=1.0) for i in range(10)]
    base = measure(ReplayResult(records, 10.0, None, None))
    calm = {"preemptions": 0, "kv_usage_peak": 0.3, "running_peak": 4.0, "waiting_peak": 0.0, "queue_s_p95": 0.0,
            "gauge_reads": 40}
    ttft = figures.pop("ttft_p95", None)
    m = replace(base, completed_rps=rps, offered_rps=offered, **{**calm, **figures})
    return replace(m, ttft_s=Percentiles(0.1, ttft, ttft)) if ttft is not None else m


def test_each_kind_is_named_with_its_figures():
    kv = diagnose(_m(preemptions=5, kv_usage_peak=0.8, waiting_peak=3.0), CAPS)
    assert kv.kind is Limit.KV_CACHE and kv.evidence["preemptions"] == 5 and "5 preemptions" in kv.sentence
    assert diagnose(_m(kv_usage_peak=0.96), CAPS).kind is Limit.KV_CACHE
    seqs = diagnose(_m(running_peak=16.0, waiting_peak=7.0, queue_s_p95=2.0), CAPS)
    assert seqs.kind is Limit.MAX_NUM_SEQS and "cap of 16" in seqs.sentence
    budget = diagnose(_m(running_peak=5.0, waiting_peak=7.0, queue_s_p95=2.0), CAPS)
    assert budget.kind is Limit.TOKEN_BUDGET and "max_num_batched_tokens 2048" in budget.sentence
    late = diagnose(_m(ttft_p95=3.0), CAPS, bound=BOUNDARIES["interactive"])
    assert late.kind is Limit.TOKEN_BUDGET  # first tokens late, nothing waiting
    # Under the long-prompt boundary first tokens are late by their share of the prompt: 0.8 s per 1,000 tokens.
    per_prompt = replace(_m(ttft_p95=3.0), ttft_per_1k_prompt_s=Percentiles(0.3, 0.8, 0.8))
    assert diagnose(per_prompt, CAPS, bound=BOUNDARIES["long-prompt"]).kind is Limit.TOKEN_BUDGET
    assert diagnose(replace(per_prompt, ttft_per_1k_prompt_s=Percentiles(0.1, 0.3, 0.3)), CAPS,
                    bound=BOUNDARIES["long-prompt"]).kind is Limit.COMPUTE
    fixed = diagnose(_m(), CAPS)
    assert fixed.kind is Limit.COMPUTE and fixed.sentence.startswith("compute (nothing at a cap)")
    assert fixed.at_rps == 5.0 and fixed.to_dict()["kind"] == "compute"


def test_gauges_read_too_seldom_name_no_limit_but_preemptions_still_show_the_kv_cache():
    unread = diagnose(_m(running_peak=0.0, gauge_reads=2), CAPS)
    assert unread.kind is Limit.UNREAD and unread.evidence["gauge_reads"] == 2
    assert "gauges were read 2 times while requests were in flight" in unread.sentence
    assert diagnose(_m(preemptions=3, gauge_reads=0), CAPS).kind is Limit.KV_CACHE  # a counter, not a gauge
    assert diagnose(_m(gauge_reads=None), CAPS).kind is Limit.COMPUTE  # stored before reads were counted


def test_only_the_reads_between_the_first_send_and_the_last_response_count():
    records = [RequestRecord(i, 0.0, 1.0 + i, 10, 10, 10, Outcome.OK, ttft_s=0.1, e2e_s=1.0) for i in range(3)]
    timeline = [TimelineSample(t, 1.0, 0.0, 0.1) for t in (0.5, 1.0, 2.5, 4.0, 4.5)]
    assert measure(ReplayResult(records, 5.0, None, None, timeline)).gauge_reads == 3  # 1.0 to 4.0 s


def test_a_short_wait_is_no_queue():
    assert diagnose(_m(running_peak=16.0, waiting_peak=6.0, queue_s_p95=0.29), CAPS).kind is Limit.COMPUTE


def test_compute_with_probes_only_when_throughput_stopped_growing():
    capacity = _m(rps=4.0, offered=4.0)
    assert diagnose(_m(rps=4.2, offered=8.0), CAPS, capacity=capacity).kind is Limit.COMPUTE
    grew = diagnose(_m(rps=7.0, offered=8.0), CAPS, capacity=capacity)
    assert grew.kind is Limit.NONE_SHOWN and "4 -> 7" in grew.sentence


def test_the_two_h200_cases_are_told_apart():
    caps = EngineCaps.of({}, H200)
    assert (caps.max_num_seqs, caps.max_num_batched_tokens) == (1024, 8192)
    # Qwen2.5-32B on Mooncake: KV at 99% with 15 requests waiting.
    kv = diagnose(_m(kv_usage_peak=0.99, running_peak=40.0, waiting_peak=15.0, queue_s_p95=3.0, ttft_p95=9.5),
                  caps, bound=BOUNDARIES["interactive"])
    assert kv.kind is Limit.KV_CACHE and "99%" in kv.sentence
    # The same with fp8 KV: KV at 59%, still 13 waiting and p95 TTFT no better: prefill, not the cache.
    fp8 = diagnose(_m(kv_usage_peak=0.59, running_peak=60.0, waiting_peak=13.0, queue_s_p95=3.0, ttft_p95=9.6),
                   caps, bound=BOUNDARIES["interactive"])
    assert fp8.kind is Limit.TOKEN_BUDGET and "59%" in fp8.sentence and "prefill" in fp8.sentence


def test_vllm_defaults_where_unset_and_unknown_without_hardware():
    cpu = HardwareInfo("cpu", None, None, 0, "cpu", 2, 8.0)
    assert (EngineCaps.of({"max_num_seqs": 2}, cpu).max_num_seqs, EngineCaps.of({}, cpu).max_num_batched_tokens) \
        == (2, 2048)
    assert EngineCaps.of({}, cpu).max_num_seqs == 128
    unknown = EngineCaps.of({}, None)
    assert unknown.max_num_seqs is None and unknown.source.startswith("unknown")
    assert "max_num_seqs unknown" in diagnose(_m(), unknown).sentence


def _judged(factor: float, verdict: Verdict, m: Measurement, index: int = 0) -> JudgedProbe:
    return JudgedProbe(Probe(index, factor, index, 10, m), verdict, [])


def test_the_edge_probe_is_the_lowest_above_the_capacity_that_did_not_pass():
    ladder = [_judged(1.0, Verdict.FAIL, _m(kv_usage_peak=0.99), 0),
              _judged(0.25, Verdict.PASS, _m(rps=1.0, offered=1.0), 1),
              _judged(0.5, Verdict.INCONCLUSIVE, _m(rps=1.05, offered=2.0), 2),
              _judged(0.35, Verdict.PASS, _m(rps=1.0, offered=1.4), 3)]
    edge = edge_probe(ladder)
    assert edge is not None and edge.probe.factor == 0.5
    found = limiting_resource(ladder, None, CAPS)
    assert found is not None and found.kind is Limit.COMPUTE and found.at_rps == 2.0
    assert found.evidence["capacity_completed_rps"] == 1.0  # against the capacity's probe, at x0.35
    # Every probe passed: the highest.
    passed = [_judged(1.0, Verdict.PASS, _m(), 0), _judged(2.0, Verdict.PASS, _m(offered=10.0), 1)]
    assert edge_probe(passed) is passed[1]
    # A fixed load: its one measurement.
    fixed = limiting_resource([], _m(preemptions=2), CAPS)
    assert fixed is not None and fixed.kind is Limit.KV_CACHE
    assert limiting_resource([], None, CAPS) is None


def test_status_lines_state_the_default_s_limit():
    from tuner.cli.present import default_line
    from tuner.analysis.scoring import Score
    from tuner.answers import BaselineAnswer

    held = diagnose(_m(running_peak=16.0, waiting_peak=7.0, queue_s_p95=2.0), CAPS).to_dict()
    score = Score(4.0, 1.0, 10.0, 1.0, {}, []).to_dict()
    line = default_line(BaselineAnswer(trial=0, state="complete", failure_class=None, score=score,
                                       limiting_resource=held))
    assert line.endswith("feasible; limited by " + held["sentence"])
    assert "limited by" not in default_line(BaselineAnswer(trial=0, state="complete", failure_class=None,
                                                           score=score))
