"""vLLM's Prometheus text parsed with prometheus_client, histogram quantiles as Prometheus computes them."""

from __future__ import annotations

import pytest

from tuner.workers.server_metrics import PREEMPTIONS, QUEUE_TIME, RUNNING, Histogram, parse_metrics

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
