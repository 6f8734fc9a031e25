"""vLLM's Prometheus text parsed with prometheus_client, histogram quantiles as Prometheus computes them; queue
figures from the requests' own times where the server reported them, else from that histogram."""

from __future__ import annotations

import json

import pytest

from tuner.traces.stats import percentile
from tuner.workers.measure import Measurement, measure
from tuner.workers.replay import ReplayResult
from tuner.workers.request_record import Outcome, RequestRecord
from tuner.workers.server_metrics import (INFERENCE_TIME, KV_USAGE, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES,
                                         QUEUE_TIME, RUNNING, WAITING, Histogram, parse_metrics)

PAGE = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="model"} 5.0
vllm:num_preemptions_created{engine="0",model_name="model"} 1.7962195872781312e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="model"} 3.0
vllm:num_requests_running{engine="1",model_name="model"} 2.0
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{engine="0",model_name="model"} 6.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="model"} 2.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1.0",model_name="model"} 6.0
vllm:request_queue_time_seconds_bucket{engine="0",le="2.0",model_name="model"} 10.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="model"} 10.0
vllm:request_queue_time_seconds_count{engine="0",model_name="model"} 10.0
"""


def test_counters_gauges_and_histograms_summed_over_engines():
    snap = parse_metrics(PAGE)
    assert snap.value(PREEMPTIONS) == 5.0
    assert snap.value(RUNNING) == 5.0  # two engines
    hist = snap.histogram(QUEUE_TIME)
    assert hist.count == 10 and hist.total == 6.0 and hist.mean() == pytest.approx(0.6)
    # rank 5 of 10 lies in (0.5, 1.0] holding ranks 3..6: 0.5 + 0.5 * (5 - 2) / 4
    assert hist.quantile(0.5) == pytest.approx(0.875)
    assert hist.quantile(0.95) == pytest.approx(1.0 + 1.0 * (9.5 - 6) / 4)


def test_histogram_delta_isolates_one_replay():
    before = Histogram(((0.5, 2.0), (1.0, 6.0), (float("inf"), 6.0)), 3.0, 6.0)
    after = Histogram(((0.5, 2.0), (1.0, 6.0), (float("inf"), 10.0)), 30.0, 10.0)
    delta = after.minus(before)
    assert delta.count == 4 and delta.total == 27.0
    assert delta.quantile(0.5) == 1.0  # every new request lies past the last finite bound
    assert Histogram((), 0.0, 0.0).quantile(0.5) is None


def _replay(queue_s: list[float | None], outcomes: list[Outcome] | None = None) -> ReplayResult:
    """A replay whose requests reported these queue times, with PAGE's queue histogram counted during it."""
    outcomes = outcomes or [Outcome.OK] * len(queue_s)
    records = [RequestRecord(i, 0.1 * i, 0.1 * i, 8, 16, 8 if o is Outcome.OK else 0, o, ttft_s=0.05,
                             e2e_s=0.2 if o is Outcome.OK else None, queue_s=q)
               for i, (q, o) in enumerate(zip(queue_s, outcomes))]
    return ReplayResult(records, 2.0, parse_metrics(""), parse_metrics(PAGE))


def test_queue_figures_come_from_the_requests_own_times_when_every_finished_request_has_one():
    # Most requests barely wait: a histogram would put its p50 inside the first bucket (0.875 s here).
    times = [0.002] * 18 + [0.4, 1.2]
    m = measure(_replay(times))
    assert m.queue_source == "per_request"
    assert m.queue_s_p50 == pytest.approx(0.002)
    assert m.queue_s_p95 == pytest.approx(percentile(times, 95)) and m.queue_s_mean == pytest.approx(0.0818)
    # Requests that never finished have no figure of their own and are left out, as from TTFT and e2e.
    m = measure(_replay(times + [None], [Outcome.OK] * 20 + [Outcome.DISCONNECTED]))
    assert m.queue_source == "per_request" and m.queue_s_p50 == pytest.approx(0.002)


@pytest.mark.parametrize("times", [[None] * 4, [0.002, 0.003, None, 0.001]])
def test_queue_figures_fall_back_to_the_histogram_unless_every_finished_request_has_its_own(times):
    m = measure(_replay(times))
    assert m.queue_source == "histogram"
    assert m.queue_s_p50 == pytest.approx(0.875) and m.queue_s_mean == pytest.approx(0.6)


def test_no_queue_figures_without_either_source():
    m = measure(ReplayResult(_replay([None, None]).records, 2.0, None, None))
    assert (m.queue_s_p50, m.queue_s_p95, m.queue_s_mean, m.queue_source) == (None, None, None, None)


def test_a_measurement_stored_before_the_queue_source_reads_back_with_none():
    stored = measure(_replay([None] * 4)).to_dict()
    del stored["queue_source"]
    assert Measurement.from_dict(stored).queue_source is None


def test_the_metrics_vllm_did_not_report_are_named_not_read_as_zero():
    # PAGE has the preemption counter, the running gauge and the queue histogram, not the others tuner reads.
    m = measure(_replay([None] * 2))
    assert m.metrics_unreported == (WAITING, KV_USAGE, INFERENCE_TIME, PREFIX_QUERIES, PREFIX_HITS)
    assert m.kv_usage_peak == 0.0  # what the missing gauge reads as, hence the name beside it
    # Stored as JSON: as the trial's files and its database row read back, the same.
    assert m.to_dict() == json.loads(json.dumps(m.to_dict()))
    assert Measurement.from_dict(m.to_dict()) == m
    # No page at all (the server was gone): nothing to check, not "all missing".
    assert measure(ReplayResult(_replay([None]).records, 2.0, None, None)).metrics_unreported is None
