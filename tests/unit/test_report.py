"""Reports without vLLM: the compare verdict, the trace reshaping, and the HTML page built from stored trials."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from tuner.storage import StoredTrial, StudyModel, StudySettings
from tuner.compare import CompareRun, pair_verdict, parse_vary, reshape_trace, scale_lengths, verdicts
from tuner.common.errors import TunerError
from tuner.common.hardware import HardwareInfo
from tuner.analysis.capacity import capacity_of
from tuner.report import (NO_TIMELINE, ReportData, kv_budget_tokens, load_curve_figure, pareto_figure, read_timeline,
                          recommendation_lines, render_html, side_by_side, summary, trial_rows)
from tuner.analysis.scoring import Rejection, Score, boundary
from tuner.study.recommendation import Recommendation, gain_sentence
from tuner.traces.records import Trace, TraceFit, TraceRequest
from tuner.traces.selection import TraceSelection
from tuner.workers.trial import TrialTrace
from tuner.cli.present import report_trial_line
from tuner.answers import TrialRowAnswer
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement, Percentiles, TrialTimings
from tuner.workers.request_record import Outcome, RequestRecord
from tuner.workers.server_metrics import TimelineSample

from checks import check_page_in_chromium
from factories import measurement, probe_ladder, study_settings

PLOT_IDS = ("pareto", "preemptions", "time_split", "timelines", "output_lengths")

def run(label: str, m: Measurement | None = None, failure_class: str | None = None, message: str = "") -> CompareRun:
    failure = f"{failure_class}: {message}" if failure_class else None
    return CompareRun(label, label.split("=")[1], m, failure, failure_class)


# --- the verdict ------------------------------------------------------------------------------------------


def test_verdict_lower_value_removes_preemptions_but_queues():
    many = run("max_num_seqs=16", measurement(preemptions=12, queue_s_mean=0.2, e2e_s=Percentiles(1, 3.0, 3.2)))
    few = run("max_num_seqs=2", measurement(preemptions=0, queue_s_mean=1.5, e2e_s=Percentiles(1, 3.48, 3.6)))
    assert pair_verdict("max_num_seqs", many, few) == (
        "max_num_seqs=2 rather than 16: removed preemptions (12 → 0) but moved the delay into the queue "
        "(mean queue time 0.20 s → 1.50 s): p95 end-to-end +16% (3.00 s → 3.48 s); both completed 16/16")


def test_verdict_more_load_brings_preemptions_and_losses():
    calm = run("rate_scale=1", measurement(queue_s_mean=0.05))
    rushed = run("rate_scale=4", measurement(preemptions=7, completed=14, failed=2, queue_s_mean=0.06,
                                             e2e_s=Percentiles(1, 4.5, 5)))
    text = pair_verdict("rate_scale", calm, rushed)
    assert text == ("rate_scale=4 rather than 1: brought preemptions (0 → 7) and completed fewer requests "
                    "(16/16 → 14/16): p95 end-to-end +50% (3.00 s → 4.50 s)")


def test_the_arrivals_verdict_states_p95_ttft_first():
    # The same requests as recorded and spread: a bucket of long prompts reaching the engine at once shows in TTFT.
    recorded = run("arrivals=recorded", measurement(ttft_s=Percentiles(1.0, 22.0, 25.0), queue_s_mean=4.0,
                                                    e2e_s=Percentiles(20, 60.0, 70.0)))
    spread = run("arrivals=spread", measurement(ttft_s=Percentiles(0.8, 6.0, 8.0), queue_s_mean=1.0,
                                                e2e_s=Percentiles(18, 48.0, 55.0)))
    assert pair_verdict("arrivals", recorded, spread) == (
        "arrivals=spread rather than recorded: cut the time spent queued (mean 4.00 s → 1.00 s): p95 TTFT -73% "
        "(22.00 s → 6.00 s): p95 end-to-end -20% (60.00 s → 48.00 s); no preemptions with either, both completed "
        "16/16")


def test_verdict_same_latency_and_no_preemptions_is_said_so():
    a = run("max_num_seqs=64", measurement())
    b = run("max_num_seqs=256", measurement(e2e_s=Percentiles(1, 3.03, 3.5)))
    assert pair_verdict("max_num_seqs", a, b) == (
        "max_num_seqs=256 rather than 64: changed neither preemptions, queueing nor completions: p95 end-to-end "
        "about the same (+1%, 3.00 s → 3.03 s); no preemptions with either, both completed 16/16")


def test_verdict_names_a_failure_class():
    ok = run("num_gpu_blocks_override=64", measurement(queue_s_mean=0.0))
    broken = run("num_gpu_blocks_override=4", None, "kv_insufficient", "the KV cache holds 512 tokens")
    assert pair_verdict("num_gpu_blocks_override", ok, broken) == (
        "num_gpu_blocks_override=4 rather than 64: the engine did not serve (kv_insufficient: the KV cache holds "
        "512 tokens), where num_gpu_blocks_override=64 did")
    assert "served 16/16 requests where num_gpu_blocks_override=4 did not" in \
        pair_verdict("num_gpu_blocks_override", broken, ok)
    assert pair_verdict("x", run("x=1", None, "load_oom"), run("x=2", None, "load_oom")).startswith(
        "x=2 rather than 1: neither served")


def test_verdicts_go_pairwise_in_order_then_first_against_last():
    runs = [run(f"max_num_seqs={n}", measurement(preemptions=p)) for n, p in ((2, 0), (8, 3), (16, 9))]
    lines = verdicts("max_num_seqs", runs)
    assert [line.split(":")[0] for line in lines] == [
        "max_num_seqs=8 rather than 2", "max_num_seqs=16 rather than 8", "max_num_seqs=16 rather than 2"]
    assert "raised preemptions (3 → 9)" in lines[1]
    assert len(verdicts("max_num_seqs", runs[:2])) == 1


# --- the varied dimension and the trace reshaping -------------------------------------------------------------


def test_parse_vary_types_engine_settings_and_trace_factors():
    v = parse_vary("max_num_seqs=64,256")
    assert (v.kind, v.values, v.label(1)) == ("engine", (64, 256), "max_num_seqs=256")
    assert parse_vary("enforce-eager=true,false").values == (True, False)
    t = parse_vary("output_scale=0.5, 1")
    assert (t.kind, t.values, t.labels) == ("trace", (0.5, 1.0), ("0.5", "1"))
    a = parse_vary("arrivals=recorded,spread")
    assert (a.kind, a.values, a.label(1)) == ("arrivals", ("recorded", "spread"), "arrivals=spread")


@pytest.mark.parametrize("text, message", [
    ("max_num_seqs=64", "at least two values"),
    ("max_num_seqs", "NAME=V1,V2"),
    ("bogus=1,2", "cannot vary 'bogus'"),
    ("max_num_seqs=a,2", "max_num_seqs expects int"),
    ("rate_scale=1,fast", "rate_scale expects a positive number"),
    ("input_scale=0,1", "input_scale expects a positive number"),
    ("max_num_seqs=4,4", "must differ"),
    ("max_num_seqs=4,,8", "empty value"),
    ("arrivals=recorded,bursty", "arrivals is one of recorded, spread, got 'bursty'"),
    ("arrivals=spread,spread", "must differ"),
])
def test_parse_vary_refuses_bad_input(text, message):
    with pytest.raises(TunerError, match=re.escape(message)):
        parse_vary(text)


def test_parse_vary_refuses_a_setting_both_set_and_varied():
    with pytest.raises(TunerError, match="both set"):
        parse_vary("max_num_seqs=2,4", EngineConfig(max_num_seqs=8))
    with pytest.raises(TunerError, match=re.escape("arrivals is both set (--spread) and varied")):
        parse_vary("arrivals=recorded,spread", spread=True)


def _trace() -> Trace:
    requests = (TraceRequest(0.0, 1100, 10, (1, 2, 3)), TraceRequest(1.0, 100, 1), TraceRequest(3.0, 7, 301))
    return Trace("t.jsonl", "native", "0" * 64, requests)


def test_scale_lengths_multiplies_and_records_the_step():
    half = scale_lengths(_trace(), output_factor=0.5)
    assert [(r.input_tokens, r.output_tokens) for r in half.requests] == [(1100, 5), (100, 1), (7, 150)]
    assert half.transformations[-1].kind == "scale_lengths"
    assert half.transformations[-1].params == {"output_factor": 0.5}
    assert half.transformations[-1].affected == 2  # the 1-token output stays at 1
    shorter = scale_lengths(_trace(), input_factor=0.4)
    assert shorter.requests[0].input_tokens == 440 and shorter.requests[0].prefix_blocks == (1,)
    assert shorter.requests[2].input_tokens == 3
    assert [r.arrival_s for r in shorter.requests] == [0.0, 1.0, 3.0]
    with pytest.raises(TunerError):
        scale_lengths(_trace(), output_factor=0)


def test_reshape_trace_by_dimension():
    trace = _trace()
    assert reshape_trace(trace, "rate_scale", 1.0) is trace
    faster = reshape_trace(trace, "rate_scale", 4.0)
    assert [r.arrival_s for r in faster.requests] == [0.0, 0.25, 0.75]
    assert faster.transformations[-1].kind == "rate_scale"
    assert [r.output_tokens for r in reshape_trace(trace, "output_scale", 2).requests] == [20, 2, 602]
    assert [r.input_tokens for r in reshape_trace(trace, "input_scale", 2).requests] == [2200, 200, 14]
    with pytest.raises(TunerError):
        reshape_trace(trace, "max_num_seqs", 2)


# --- the study report, from stored trials ------------------------------------------------------------------


MACHINE = HardwareInfo("cpu", None, None, 0, "Test CPU 9000", 2, 8.0)
HARDWARE = MACHINE.to_dict()
SPACE_FIXED = {"enforce_eager": True, "max_model_len": 1024, "kv_cache_memory_bytes": 268435456}


def settings() -> StudySettings:
    return study_settings(
        name="demo", created_at="2025-01-01T00:00:00+00:00",
        model_info=StudyModel("LlamaForCausalLM", 2048, 2048, 4096),
        trace_selection=TraceSelection(None, 16, 100.0, "clip"), limits={"ttft_p95_s": 20.0, "e2e_p95_s": 60.0},
        space_name="test-study", space_text="name: test-study\n", seed=3, startup_timeout_s=600.0)


def stored(number: int, state: str, config: dict, m: Measurement | None = None, *, failure_class: str | None = None,
           score: Score | Rejection | None = None, **kw) -> StoredTrial:
    config = EngineConfig.from_dict({**SPACE_FIXED, **config})
    return StoredTrial(
        study_name="demo", trial_number=number, attempt=1, state=state, engine_config=config,
        serve_command=config.serve_command("/models/tiny"),
        measurement=m, failure_class=failure_class,
        failure_message=kw.pop("failure_message", None), log_excerpt=None, estimated_max_model_len=None,
        exit_code=None, timings=TrialTimings(20.0, 10.0, 1.0),
        hardware=MACHINE, vllm_version="0.32.0", started_at="2025-01-01T00:00:00+00:00",
        finished_at="2025-01-01T00:01:00+00:00", score=score, **kw)


def scored(m: Measurement, feasible: bool = True) -> Score:
    violations = [] if feasible else ["e2e_p95_s 70.000 s is over the limit 60.000 s"]
    return Score(completed_rps=m.completed_rps, e2e_p95_s=m.e2e_s.p95, output_tps=m.output_tps,
                 completion_ratio=m.completed / m.requests, violations=violations,
                 constraints={"ttft_p95_s": m.ttft_s.p95 - 20, "e2e_p95_s": m.e2e_s.p95 - 60,
                              "completion_ratio": 0.99 - m.completed / m.requests})


def requests_of(m: Measurement, short_by: int = 0) -> list[RequestRecord]:
    rows = []
    for i in range(m.requests):
        asked = 50 + 10 * i
        served = asked - (short_by if i == 0 else 0)
        rows.append(RequestRecord(i, 0.01 * i, 0.01 * i, asked, 200, served,
                                  Outcome.OK if served == asked else Outcome.TRUNCATED, ttft_s=0.1,
                                  e2e_s=1.0 + 0.1 * i))
    return rows


def timeline(peak: float) -> list[TimelineSample]:
    return [TimelineSample(0.5 * i, min(peak, i), max(0.0, 16 - peak - i), min(1.0, 0.1 * i)) for i in range(12)]


def report_data(with_timelines: bool = True) -> ReportData:
    base_m = measurement()
    pressured_m = measurement(preemptions=31, preemptions_per_100=193.75, queue_s_mean=0.9, completed_rps=1.7,
                              e2e_s=Percentiles(1.2, 3.3, 3.5), kv_usage_peak=1.0, waiting_peak=12.0)
    slow_m = measurement(completed_rps=1.2, e2e_s=Percentiles(30, 70.0, 75.0),
                         metrics_unreported=("vllm:kv_cache_usage_perc",))
    pruned_m = measurement(completed=3, failed=13, outcomes={"ok": 3, "not_sent": 13})
    trials = (
        stored(0, "complete", {}, base_m, score=scored(base_m)),
        stored(1, "infeasible", {"max_num_seqs": 16, "max_num_batched_tokens": 8},
               score=Rejection(["max_num_batched_tokens 8 is below max_num_seqs 16"])),
        stored(2, "failed", {"max_num_seqs": 8, "num_gpu_blocks_override": 4}, failure_class="kv_insufficient",
               failure_message="the KV cache (512 tokens) cannot hold one request of 1024 tokens\nmore"),
        stored(3, "complete", {"max_num_seqs": 16, "num_gpu_blocks_override": 24}, pressured_m,
               score=scored(pressured_m)),
        stored(4, "complete", {"max_num_seqs": 2, "num_gpu_blocks_override": 96}, slow_m,
               score=scored(slow_m, feasible=False)),
        stored(5, "pruned", {"max_num_seqs": 4}, pruned_m, prune_reason="p95 cannot meet it"),
    )
    bound = boundary("interactive", settings().limits)
    rec = Recommendation(trials[3], bound, trials[0])
    reqs = {0: requests_of(base_m), 3: requests_of(pressured_m, short_by=5), 4: requests_of(slow_m)}
    lines = {0: timeline(16), 3: timeline(6)} if with_timelines else {}
    kv = {0: 131072, 3: 3072, 4: 12288, 5: 131072}
    return ReportData(settings(), bound, trials, rec, trials[0], reqs, lines, kv, "2025-01-01T00:02:00+00:00")


def test_side_by_side_puts_default_and_recommendation_together():
    rows = {what: (a, b, change) for what, a, b, change in side_by_side(report_data())}
    assert rows["trial"][:2] == ("0", "3")
    assert rows["max_num_seqs"] == ("vLLM default", "16", "changed")
    assert rows["enforce_eager"] == ("True", "True", "")
    assert rows["preemptions"] == ("0", "31", "0 → 31")
    assert rows["p95 end-to-end"] == ("3.000 s", "3.300 s", "+10%")
    assert rows["KV budget (tokens)"][:2] == ("131072", "3072")
    assert rows["meets the interactive boundary"][:2] == ("yes", "yes")
    # What issue 19 asks of a long-context answer, from vLLM's own figures: 0.2 s of 1.4 s queued, 0.9 of 2.1.
    assert rows["queue's share of latency (vLLM)"][:2] == ("14%", "43%")
    assert rows["preemptions per 100 requests"][:2] == ("0.0", "193.8")
    assert rows["prefix-cache hit rate"][:2] == ("-", "-")  # vLLM reported no prefix-cache queries
    assert rows["KV usage peak"][:2] == ("40%", "100%")


def test_trial_rows_carry_failure_classes_and_roles():
    rows = {r.trial: r for r in trial_rows(report_data())}
    assert rows[0].roles == ["default", "Pareto"] and rows[3].roles == ["recommended", "Pareto"]
    assert rows[2].failure_class == "kv_insufficient" and rows[2].why.startswith("the KV cache (512")
    assert rows[1].why.startswith("rejected before launch") and rows[1].state == "infeasible"
    assert rows[4].feasible is False and rows[4].why.startswith("outside the boundary")
    assert rows[4].why.endswith("; vLLM did not report vllm:kv_cache_usage_perc: read as 0")
    assert rows[0].why == "" and rows[3].why == ""  # every metric reported (or not checked), within the boundary
    assert rows[5].why == "pruned: p95 cannot meet it" and rows[5].feasible is None


def test_trial_rows_name_the_limiting_resource_in_the_table_and_the_json():
    rows = {r.trial: r for r in trial_rows(report_data())}
    pressured = rows[3].limiting_resource
    assert pressured is not None and pressured.kind.value == "kv_cache" and "31 preemptions" in pressured.sentence
    assert rows[2].limiting_resource is None  # measured nothing
    assert rows[3].to_dict()["limiting_resource"]["evidence"]["preemptions"] == 31
    assert "limited by" in render_html(report_data())


def test_summary_states_boundary_machine_trace_and_vllm_version():
    data = summary(report_data())
    assert data["pareto"] == [0, 3]
    text = " ".join(data["recommendation_text"])
    assert "interactive (p95 TTFT <= 20 s, p95 e2e <= 60 s, completion >= 99%)" in text
    assert "CPU: Test CPU 9000, 2 cores" in text and "vLLM 0.32.0" in text
    assert "azure_conv_2023.csv (sha256 abababababab, 16 requests" in text
    # Measured once each, never validated: no gain is stated, and the sentence says why.
    assert "x1.06" not in text and "trial 0): not validated, each was measured once" in text
    assert data["recommendation"]["validation"] is None
    assert data["recommendation"]["trial"] == 3 and data["recommendation"]["hardware"] == HARDWARE


def test_html_holds_every_section_and_embeds_plotly():
    page = render_html(report_data())
    for key in PLOT_IDS:
        assert f'data-figure="{key}"' in page, key
    assert "Plotly.newPlot" in page and "plotly.js v" in page  # the library itself, inlined
    assert not re.search(r"<script[^>]+src=", page), "nothing may be fetched"
    assert "kv_insufficient" in page and "rejected before launch" in page and "p95 cannot meet it" in page
    assert "vllm serve /models/tiny" in page and "CPU: Test CPU 9000, 2 cores" in page
    assert NO_TIMELINE not in page


def test_pareto_plot_draws_the_boundary_and_marks_default_and_recommendation():
    fig = pareto_figure(report_data())
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert [(s.y0, s.y1) for s in lines] == [(60.0, 60.0)]
    assert any(a.text == "interactive boundary: p95 end-to-end ≤ 60 s" for a in fig.layout.annotations)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert "Pareto front" in names and "outside the boundary" in names
    assert "recommended: trial 3" in names and "default: trial 0" in names
    front = next(t for t in fig.data if t.name == "Pareto front")
    assert sorted(front.x) == [1.6, 1.7]  # trials 0 and 3; trial 4 broke the e2e limit


def test_html_says_when_no_timeline_was_recorded():
    page = render_html(report_data(with_timelines=False))
    assert 'data-empty="timelines"' in page and NO_TIMELINE in page
    assert 'data-figure="timelines"' not in page


def test_html_without_a_feasible_trial_says_so():
    data = report_data()
    data = replace(data, recommendation=None)
    page = render_html(data)
    assert "No trial met the interactive" in page and "measured on CPU: Test CPU 9000" in page
    assert 'data-figure="pareto"' in page  # the measured trials are still drawn


def test_timeline_csv_and_kv_budget_are_read_from_the_trial_folder(tmp_path):
    (tmp_path / "timeline.csv").write_text("t_s,running,waiting,kv_usage\n0.5,2,14,0.25\n1.0,2,13,0.5\n")
    assert read_timeline(tmp_path / "timeline.csv") == [TimelineSample(0.5, 2, 14, 0.25),
                                                         TimelineSample(1.0, 2, 13, 0.5)]
    assert read_timeline(tmp_path / "missing.csv") is None
    (tmp_path / "bad.csv").write_text("when,what\n1,2\n")
    assert read_timeline(tmp_path / "bad.csv") is None
    log = tmp_path / "server.log"
    log.write_text("INFO [kv_cache_utils.py:2327] CPU KV cache size: 3,072 tokens, Maximum concurrency ...\n")
    trial = report_data().trials[3]
    assert kv_budget_tokens(trial, settings().model_info, log) == 3072
    assert kv_budget_tokens(trial, settings().model_info, tmp_path / "none.log") is None  # blocks of unknown size
    assert kv_budget_tokens(report_data().trials[0], settings().model_info, None) == 268435456 // 4096


def test_page_built_from_stored_trials_renders_in_chromium(tmp_path):
    from conftest import REPO

    path = tmp_path / "report.html"
    path.write_text(render_html(report_data()))
    found = check_page_in_chromium(path, REPO / "test-artifacts" / "report-unit.png")
    assert sorted(found["figures"]) == sorted(PLOT_IDS)


# --- load curves: a study whose trials probed several loads ------------------------------------------------

# (factor, verdict, p95 TTFT s, p95 end-to-end s); the boundary: p95 TTFT <= 20 s, p95 end-to-end <= 60 s.
DEFAULT_LADDER = [(1.0, "pass", 0.2, 3.0), (2.0, "pass", 0.5, 6.0), (4.0, "fail", 30.0, 90.0),
                  (2.83, "pass", 1.0, 10.0), (3.36, "fail", 22.0, 70.0), (3.08, "inconclusive", 15.0, 55.0)]
RECOMMENDED_LADDER = [(1.0, "pass", 0.2, 3.3), (2.0, "pass", 0.3, 4.0), (4.0, "pass", 0.6, 8.0),
                      (8.0, "fail", 40.0, 120.0), (5.66, "fail", 25.0, 80.0), (4.76, "pass", 2.0, 20.0)]


def search_data() -> ReportData:
    """report_data() as a study with a load search: the default and the recommendation scored with the capacity
    their probes found, the pruned trial with the one probe it ran, stopped early."""
    data = report_data()
    trials = list(data.trials)
    for number, ladder in ((0, DEFAULT_LADDER), (3, RECOMMENDED_LADDER)):
        judged = probe_ladder(ladder)
        capacity = capacity_of(judged, data.settings.load, 100.0)
        t = trials[number]
        trials[number] = replace(t, probes=judged, score=replace(t.score, capacity=capacity))
    trials[5] = replace(trials[5], probes=probe_ladder([(1.0, "fail", 0.3, 3.0)], stop_reason="p95 cannot meet it"))
    return replace(data, trials=tuple(trials), recommendation=replace(data.recommendation, trial=trials[3],
                                                                      baseline=trials[0]), baseline=trials[0])


def test_load_curves_draw_every_probe_by_offered_load_with_its_verdict():
    fig = load_curve_figure(search_data())
    curves = {(t.name, t.yaxis): t for t in fig.data if t.mode == "lines+markers"}
    assert sorted(curves) == [(name, axis) for name in ("trial 0 (default)", "trial 3 (recommended)", "trial 5")
                              for axis in ("y", "y2")]
    default_ttft, default_e2e = curves["trial 0 (default)", "y"], curves["trial 0 (default)", "y2"]
    factors = sorted(f for f, *_ in DEFAULT_LADDER)
    assert list(default_ttft.x) == pytest.approx([1.6 * f for f in factors])  # from the lowest load up
    assert list(default_ttft.y) == [0.2, 0.5, 1.0, 15.0, 22.0, 30.0]
    assert list(default_e2e.y) == [3.0, 6.0, 10.0, 55.0, 70.0, 90.0]
    assert list(default_ttft.marker.symbol) == ["circle", "circle", "circle", "diamond", "x", "x"]
    assert len(set(default_ttft.marker.color)) == 3  # pass, inconclusive and fail apart
    assert "over a limit" in default_ttft.hovertext[-1] and "inconclusive" in default_ttft.hovertext[3]
    assert list(curves["trial 5", "y"].marker.symbol) == ["x"]
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert {"pass", "fail", "inconclusive"} <= set(legend)


def test_load_curves_draw_the_boundarys_limits_and_mark_each_knee():
    fig = load_curve_figure(search_data())
    lines = [(s.yref, s.y0) for s in fig.layout.shapes if s.type == "line"]
    assert lines == [("y", 20.0), ("y2", 60.0)]
    texts = {a.text for a in fig.layout.annotations}
    assert {"interactive boundary: p95 TTFT ≤ 20 s", "interactive boundary: p95 end-to-end latency ≤ 60 s"} <= texts
    knees = {(t.name, t.yaxis): (t.x[0], t.y[0]) for t in fig.data if t.name and t.name.endswith(": knee")}
    # The highest load that passed: x2.83 of the reference for the default, x4.76 for the recommendation.
    assert knees["trial 0 (default): knee", "y"] == (pytest.approx(1.6 * 2.83), 1.0)
    assert knees["trial 0 (default): knee", "y2"] == (pytest.approx(1.6 * 2.83), 10.0)
    assert knees["trial 3 (recommended): knee", "y2"] == (pytest.approx(1.6 * 4.76), 20.0)
    assert not any(name.startswith("trial 5") for name, _ in knees)  # no probe of it passed


def test_a_boundary_without_a_ttft_limit_draws_only_the_end_to_end_line():
    data = search_data()
    data = replace(data, boundary=boundary("interactive", {"ttft_p95_s": None, "e2e_p95_s": 60.0}))
    assert [(s.yref, s.y0) for s in load_curve_figure(data).layout.shapes if s.type == "line"] == [("y2", 60.0)]


def test_trial_rows_and_the_json_carry_each_trials_capacity_and_probes():
    rows = {r.trial: r for r in trial_rows(search_data())}
    assert rows[0].capacity_cells == ("4.528", "x283", "6 probes: bracketed within 10%; the load above it, "
                                                       "4.93 req/s, was inconclusive")
    assert rows[3].capacity_cells[0] == "7.616" and rows[3].capacity_cells[2] == "6 probes: probe budget of 6 spent"
    # The pruned trial was not scored: its capacity is summed up again from the probe it ran.
    assert rows[5].capacity_cells == ("-", "-", "1 probe: no probe passed: the reference load failed")
    assert rows[1].capacity is None and rows[1].probes == [] and rows[1].capacity_cells == ("-", "-", "-")
    trials = {t["trial"]: t for t in json.loads(json.dumps(summary(search_data())))["trials"]}
    assert trials[0]["capacity"]["rps"] == pytest.approx(4.528) and trials[0]["capacity"]["rate_scale"] == 283.0
    assert [p["verdict"] for p in trials[0]["probes"]] == [v for _, v, *_ in DEFAULT_LADDER]
    assert trials[0]["probes"][2]["reasons"] == ["probe at x4: over a limit"]
    assert trials[0]["probes"][2]["measurement"]["ttft_s"]["p95"] == 30.0
    assert trials[1]["capacity"] is None and trials[1]["probes"] == []


def test_a_study_at_a_fixed_load_has_no_load_curves_and_no_capacity():
    data = report_data()
    assert load_curve_figure(data) is None
    assert all("capacity" not in row and "probes" not in row for row in summary(data)["trials"])
    page = render_html(data)
    assert "load_curves" not in page and "capacity req/s" not in page and "load search" not in page


def test_the_report_of_a_search_states_each_capacity_in_words_side_by_side_and_per_trial():
    data = search_data()
    lines = recommendation_lines(data)
    carries = [line for line in lines if "within the boundary;" in line]
    assert carries == ["It carries 7.62 req/s (x476 the trace's rate) within the boundary; at your traffic p95 "
                       "end-to-end is 3.3 s.",
                       "vLLM's default configuration (trial 0) carries 4.53 req/s (x283 the trace's rate) within "
                       "the boundary; at your traffic p95 end-to-end is 3 s."]
    assert "spread" not in lines[2]  # a selection's unset switch is not worth a word
    # Once validated, the search's figure is said to be the search's, and the launches follow the verdict: where a
    # capacity in the search and in fresh launches differ, the reader sees both.
    from tuner.validation import Arm, ArmResult, Validation
    validated = Validation(1, 2, (ArmResult(Arm(0, None), (6, 8), (5.1, 5.1), brackets=(0.5, 0.5)),
                                  ArmResult(Arm(1, 3), (7, 9), (7.6, 8.0), brackets=(0.1, 0.1))), (6, 7, 8, 9),
                           "req/s within the boundary", 0.1)
    lines = recommendation_lines(replace(data, recommendation=replace(data.recommendation, validation=validated)))
    assert lines[4].startswith("In the search, it carries 7.62 req/s (x476 the trace's rate) within the boundary")
    assert lines[-2] == ("Launch by launch, in req/s within the boundary, each with the lowest load above it that did "
                         "not pass: vLLM's default 5.1 (7.65), 5.1 (7.65); trial 3 7.6 (8.36), 8 (8.8).")
    # Last, what finding it out cost: these trials' own time (no run kept, so no idle).
    assert lines[-1] == f"Spent {data.spent.text()}." and lines[-1].endswith("idle 0s; 6 launches.")
    rows = {what: (a, b, change) for what, a, b, change in side_by_side(data)}
    assert rows["capacity within the boundary"] == ("4.53 req/s (x283 the trace's rate)",
                                                    "7.62 req/s (x476 the trace's rate)", "+68%")
    assert "capacity within the boundary" not in {row[0] for row in side_by_side(report_data())}
    assert not any(row[0].startswith("of it carried whole") for row in side_by_side(data))


def test_a_context_that_clips_requests_is_answered_with_the_traffic_it_carries_whole():
    data = search_data()
    trials = list(data.trials)
    trials[3] = replace(trials[3], score=replace(trials[3].score, whole_share=0.5))
    data = replace(data, trials=tuple(trials), recommendation=replace(data.recommendation, trial=trials[3]))
    rows = {what: (a, b, change) for what, a, b, change in side_by_side(data)}
    assert rows["of it carried whole (clipped: 0% / 50%)"] == ("4.53 req/s", "3.81 req/s", "-16%")
    assert any(line.startswith("It carries 7.62 req/s (x476 the trace's rate) within the boundary, 3.81 req/s of it "
                               "whole (50% of the requests were clipped") for line in recommendation_lines(data))
    by_trial = {r.trial: r for r in trial_rows(data)}
    line = report_trial_line(TrialRowAnswer.model_validate(by_trial[3].to_dict()))
    assert "capacity 7.62 req/s (x476 the trace's rate)" in line


def test_a_trial_row_says_how_many_requests_its_context_clipped():
    data = report_data()
    fitted = replace(data.trials[3], trace_fit=TraceFit("clip", 1024, 16, 2))
    rows = {r.trial: r for r in trial_rows(replace(data, trials=(*data.trials[:3], fitted, *data.trials[4:])))}
    answer = TrialRowAnswer.model_validate(rows[3].to_dict())
    assert answer.trace_fit == TraceFit("clip", 1024, 16, 2)
    assert "2 of 16 requests (12%) clipped to max_model_len 1024" in report_trial_line(answer)
    assert rows[0].trace_fit is None and "clipped" not in report_trial_line(TrialRowAnswer.model_validate(
        rows[0].to_dict()))
    page = render_html(replace(data, trials=(*data.trials[:3], fitted, *data.trials[4:])))
    assert page.count("clipped to max_model_len") == 1


def test_side_by_side_states_no_change_between_values_that_read_the_same():
    data = report_data()
    base, rec = data.trials[0], data.trials[3]
    quiet = [replace(t, measurement=replace(t.measurement, queue_s_mean=q)) for t, q in ((base, 1e-5), (rec, 3e-4))]
    rows = {what: change for what, _, _, change in side_by_side(replace(data, baseline=quiet[0], recommendation=replace(
        data.recommendation, trial=quiet[1])))}
    assert rows["mean queue time (vLLM)"] == ""


def test_html_of_a_search_shows_the_load_curves_and_the_capacities():
    page = render_html(search_data())
    assert 'data-figure="load_curves"' in page
    assert page.index('data-figure="pareto"') < page.index('data-figure="load_curves"') < page.index('id="trials"')
    assert "<th>capacity req/s</th><th>x trace&#39;s rate</th>" in page and "<th>load search</th>" in page
    assert "6 probes: probe budget of 6 spent" in page and ">x283<" in page


def test_page_with_load_curves_renders_in_chromium(tmp_path):
    from conftest import REPO

    path = tmp_path / "report.html"
    path.write_text(render_html(search_data()))
    found = check_page_in_chromium(path, REPO / "test-artifacts" / "report-load-curves-unit.png")
    assert sorted(found["figures"]) == sorted([*PLOT_IDS, "load_curves"])


def test_compare_table_puts_the_values_side_by_side():
    from tuner.compare import CompareResult, parse_vary
    from tuner.cli.report import _compare_rows
    from tuner.analysis.scoring import score

    variation = parse_vary("max_num_seqs=2,16")
    bound = boundary("interactive")
    few, many = measurement(queue_s_mean=1.5), measurement(preemptions=9, preemptions_per_100=56.25)
    runs = [CompareRun("max_num_seqs=2", 2, few, score=score(few, bound, 1.0)),
            CompareRun("max_num_seqs=16", 16, many, score=score(many, bound, 1.0)),
            run("max_num_seqs=64", None, "kv_insufficient", "too small")]
    rows = dict(_compare_rows(CompareResult(variation, EngineConfig(), runs, bound)))
    assert rows["preemptions"] == ["0 (0.0 per 100)", "9 (56.2 per 100)", "-"]
    assert [str(cell) for cell in rows["state"]] == ["ok", "ok", "kv_insufficient"]
    assert rows["state"][2].style == "red"
    assert rows["queue time mean / p95 s (vLLM)"][0] == "1.500 / 0.300"
    assert rows["meets the interactive boundary"] == ["yes", "yes", "-"]


def test_one_gain_sentence_for_the_report_and_the_command_line():
    from tuner.describe import recommendation_dict
    from tuner.answers import RecommendationAnswer
    from tuner.validation import Arm, ArmResult, Validation

    data = report_data()
    rec, trials = data.recommendation, data.trials
    once = "not validated, each was measured once"
    hint = "; `tuner study validate` states the gain with its interval"
    cases = {  # the baseline: the command line's sentence (the report's is the same, capitalized, with a stop)
        0: f"against vLLM's default configuration (trial 0): {once}{hint}",
        2: "vLLM's default configuration (trial 2) gave no score to compare: kv_insufficient; not validated",
        4: f"against vLLM's default configuration (trial 4): {once}, and the default broke the boundary at your "
           f"traffic{hint}",
        None: "vLLM's default configuration was not run in this study; not validated",
        3: "vLLM's default configuration (trial 3) is itself the best found, measured once: not validated",
    }
    validated = Validation(1, 2, (ArmResult(Arm(0, None), (6, 8), (2.0, 2.2)),
                                  ArmResult(Arm(1, 3), (7, 9), (2.9, 3.1))), (6, 7, 8, 9), "req/s within the boundary")
    for number, cli_text in cases.items():
        for validation in (None, validated):
            case = replace(rec, baseline=trials[number] if number is not None else None, validation=validation)
            expected = validated.sentence() if validation else cli_text
            # No gain is ever stated without its interval: only the validated sentence has a ratio.
            assert ("x1." in expected) == (validation is not None)
            # The report's is a sentence: a capital first, but vLLM keeps its own case.
            capital = expected if expected.startswith("vLLM") else f"{expected[0].upper()}{expected[1:]}"
            assert case.gain_sentence(report=True) == f"{capital}."
            # The command line states the service's answer, read back from JSON.
            answer = RecommendationAnswer.model_validate_json(
                RecommendationAnswer.model_validate(recommendation_dict(case, data.settings)).model_dump_json())
            assert gain_sentence(answer.baseline, answer.validation.sentence if answer.validation else None,
                                 answer.trial) == expected == case.gain_sentence()
    assert validated.sentence() == ("trial 3 carries more than vLLM's default (x1.43, 95% CI 1.08-1.89, 2 repeats "
                                    "each): recommended")
    unrun = replace(rec, baseline=None, validation=None).gain_sentence(report=True)
    assert unrun == "vLLM's default configuration was not run in this study; not validated."


@pytest.mark.parametrize("source, shown", [
    ("per_request", "0.004 / 0.090  (each request's own, from vLLM)"),
    ("histogram", "0.004 / 0.090  (vLLM's histogram, interpolated in its buckets)"),
    (None, "0.004 / 0.090"),  # a measurement stored before the source was recorded
])
def test_trial_table_says_where_its_queue_figures_come_from(source, shown):
    from rich.console import Console

    from tuner.cli.trial import _trial_table
    from factories import request_records, trial_record

    record = replace(trial_record(request_records(3), died=False),
                     trace=TrialTrace("azure_conv_2023.csv", "azure", "ab" * 32, 3, 0.5, []),
                     measurement=measurement(queue_s_p50=0.004, queue_s_p95=0.09, queue_source=source))
    console = Console(width=200, record=True)
    console.print(_trial_table(record))
    [line] = [line for line in console.export_text().splitlines() if "queue p50 / p95 s" in line]
    assert line.split("queue p50 / p95 s", 1)[1].strip(" │") == shown


@pytest.mark.parametrize("unreported, shown", [
    (("vllm:kv_cache_usage_perc",), "vllm:kv_cache_usage_perc: read as 0 above"),
    ((), None),  # vLLM reported every metric tuner reads
    (None, None),  # not checked: no page, or stored before the check
])
def test_trial_table_names_the_metrics_vllm_did_not_report(unreported, shown):
    from rich.console import Console

    from tuner.cli.trial import _trial_table
    from factories import request_records, trial_record

    record = replace(trial_record(request_records(3), died=False),
                     trace=TrialTrace("azure_conv_2023.csv", "azure", "ab" * 32, 3, 0.5, []),
                     measurement=measurement(metrics_unreported=unreported))
    console = Console(width=200, record=True)
    console.print(_trial_table(record))
    lines = [line for line in console.export_text().splitlines() if "not reported by vLLM" in line]
    assert [line.split("not reported by vLLM", 1)[1].strip(" │") for line in lines] == ([shown] if shown else [])


def test_a_recommendation_in_fp8_says_so_and_shows_the_best_at_the_models_own_precision(capsys):
    from tuner.describe import recommendation_dict
    from tuner.answers import RecommendationAnswer
    from tuner.study.recommendation import own_precision_best
    from tuner.validation import Arm, ArmResult, Validation

    data = report_data()
    fast_m = measurement(completed_rps=2.4)
    fp8 = stored(3, "complete", {"max_num_seqs": 16, "kv_cache_dtype": "fp8", "quantization": "fp8"}, fast_m,
                 score=scored(fast_m))
    own_m = measurement(completed_rps=2.1)
    own = stored(6, "complete", {"max_num_seqs": 8}, own_m, score=scored(own_m))
    trials = (*data.trials[:3], fp8, *data.trials[4:], own)
    # The validation launched the default, the FP8 finalist and the best at the model's own precision.
    validated = Validation(1, 2, (ArmResult(Arm(0, None), (7, 10), (2.0, 2.2)),
                                  ArmResult(Arm(1, 3), (8, 11), (2.9, 3.1)), ArmResult(Arm(2, 6), (9, 12), (2.0, 2.1))),
                           (7, 8, 9, 10, 11, 12), "req/s within the boundary")
    assert own_precision_best(list(trials), fp8, validated) is own
    assert own_precision_best(list(trials), own, validated) is None  # a recommendation at its own precision
    rec = replace(data.recommendation, trial=fp8, validation=validated, own_precision=own)
    data = replace(data, trials=trials, recommendation=rec)
    lines = recommendation_lines(data)
    assert lines[1] == fp8.serve_command and "--quantization fp8" in lines[1] and "--kv-cache-dtype fp8" in lines[1]
    assert lines[2] == ("Weights and KV cache in FP8: outputs differ from the model's own precision; check your own "
                        "quality evaluations.")
    assert lines[-2].startswith(f"At the model's own precision the best is trial 6 ({own.serve_command})")
    assert lines[-2].endswith(f"; against vLLM's default: {validated.gain_of(validated.arms[2]).text()}."), lines[-2]
    # Programs and the service read the same, marked: changes_numerics, the sentence, and the other configuration.
    answer = RecommendationAnswer.model_validate_json(
        RecommendationAnswer.model_validate(recommendation_dict(rec, data.settings)).model_dump_json())
    assert answer.changes_numerics and answer.numerics.startswith("weights and KV cache in FP8: outputs differ")
    assert answer.own_precision.trial == 6 and answer.own_precision.serve_command == own.serve_command
    assert answer.own_precision.gain.startswith("against vLLM's default: x") and "95% CI" in answer.own_precision.gain
    plain = RecommendationAnswer.model_validate(recommendation_dict(report_data().recommendation, data.settings))
    assert not plain.changes_numerics and plain.numerics is None and plain.own_precision is None
    # `tuner study best` prints the same from the answer.
    from tuner.cli.present import print_recommendation

    capsys.readouterr()
    print_recommendation(answer)
    printed = " ".join(capsys.readouterr().out.split())
    assert "weights and KV cache in FP8: outputs differ from the model's own precision" in printed, printed
    assert "at the model's own precision the best is trial 6; against vLLM's default: x" in printed, printed
    assert " ".join(own.serve_command.split()) in printed


def test_a_validation_of_fp8_finalists_launches_the_best_at_the_models_own_precision_too():
    from tuner.study.recommendation import finalists

    def trial(number: int, config: dict, rps: float) -> StoredTrial:
        m = measurement(completed_rps=rps)
        return stored(number, "complete", config, m, score=scored(m))

    default = EngineConfig.from_dict(SPACE_FIXED)
    trials = [trial(0, {}, 2.0), trial(1, {"kv_cache_dtype": "fp8"}, 3.0),
              trial(2, {"quantization": "fp8", "max_num_seqs": 8}, 2.8), trial(3, {"max_num_seqs": 8}, 2.5),
              trial(4, {"max_num_seqs": 4}, 2.2)]
    assert finalists(trials, 1, default, {0}) == [1, 3]  # the FP8 best, and the best at the model's own precision
    assert finalists(trials, 2, default, {0}) == [1, 2, 3]
    assert finalists(trials, 3, default, {0}) == [1, 2, 3]  # the third is at the own precision already
    assert finalists([trials[0], trials[3], trials[1]], 1, default, {0}) == [1, 3]
    assert finalists([t for t in trials if t.trial_number != 3 and t.trial_number != 4], 1, default, {0}) == [1]
