"""Reports without vLLM: the compare verdict, the trace reshaping, and the HTML page built from stored trials."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tuner.storage import StoredTrial, StudyModel, StudySettings
from tuner.compare import CompareRun, pair_verdict, parse_vary, reshape_trace, scale_lengths, verdicts
from tuner.errors import TunerError
from tuner.hardware import HardwareInfo
from tuner.report import (NO_TIMELINE, ReportData, kv_budget_tokens, pareto_figure, read_timeline, render_html,
                          side_by_side, summary, trial_rows)
from tuner.scoring import Rejection, Score, boundary
from tuner.study.recommendation import Recommendation
from tuner.traces.records import Trace, TraceRequest
from tuner.traces.selection import TraceSelection
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement, Percentiles, TrialTimings
from tuner.workers.replay import Outcome, RequestRecord
from tuner.workers.server_metrics import TimelineSample

from checks import check_page_in_chromium
from factories import measurement, study_settings

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


@pytest.mark.parametrize("text, message", [
    ("max_num_seqs=64", "at least two values"),
    ("max_num_seqs", "NAME=V1,V2"),
    ("bogus=1,2", "cannot vary 'bogus'"),
    ("max_num_seqs=a,2", "max_num_seqs expects int"),
    ("rate_scale=1,fast", "rate_scale expects a positive number"),
    ("input_scale=0,1", "input_scale expects a positive number"),
    ("max_num_seqs=4,4", "must differ"),
    ("max_num_seqs=4,,8", "empty value"),
])
def test_parse_vary_refuses_bad_input(text, message):
    with pytest.raises(TunerError, match=re.escape(message)):
        parse_vary(text)


def test_parse_vary_refuses_a_setting_both_set_and_varied():
    with pytest.raises(TunerError, match="both set"):
        parse_vary("max_num_seqs=2,4", EngineConfig(max_num_seqs=8))


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
    slow_m = measurement(completed_rps=1.2, e2e_s=Percentiles(30, 70.0, 75.0))
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


def test_trial_rows_carry_failure_classes_and_roles():
    rows = {r.trial: r for r in trial_rows(report_data())}
    assert rows[0].roles == ["default", "Pareto"] and rows[3].roles == ["recommended", "Pareto"]
    assert rows[2].failure_class == "kv_insufficient" and rows[2].why.startswith("the KV cache (512")
    assert rows[1].why.startswith("rejected before launch") and rows[1].state == "infeasible"
    assert rows[4].feasible is False and rows[4].why.startswith("outside the boundary")
    assert rows[5].why == "pruned: p95 cannot meet it" and rows[5].feasible is None


def test_summary_states_boundary_machine_trace_and_vllm_version():
    data = summary(report_data())
    assert data["pareto"] == [0, 3]
    text = " ".join(data["recommendation_text"])
    assert "interactive (p95 TTFT <= 20 s, p95 e2e <= 60 s, completion >= 99%)" in text
    assert "CPU: Test CPU 9000, 2 cores" in text and "vLLM 0.32.0" in text
    assert "azure_conv_2023.csv (sha256 abababababab, 16 requests" in text
    assert "x1.06" in text  # completed throughput over the default's
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


def test_compare_table_puts_the_values_side_by_side():
    from tuner.compare import CompareResult, parse_vary
    from tuner.cli.report import _compare_rows
    from tuner.scoring import score

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
