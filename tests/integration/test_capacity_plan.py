"""`tuner study plan` on real stored studies (SQLite and PostgreSQL), built without engines: replicas of each
configuration for the user's traffic, with a range where a validation gave an interval, hour by hour from a trace of a
day, and what it costs; the command line, the service's route and the dashboard's attribute."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient

from factories import SEQS_SPACE, native_trace, scored_trial, store_study, study_settings
from tuner.common.errors import TunerError
from tuner.service.api import build_api
from tuner.service.client import RemoteStudies, ServiceClient
from tuner.storage import ValidationMark
from tuner.studies import LocalStudies
from tuner.study.capacity_plan import CAPACITY_PLAN_ATTR, PlanOptions, plan_capacity
from tuner.study.plan import load_optuna_study
from tuner.traces.selection import TraceSelection
from tuner.workers.engine_config import EngineConfig

from conftest import run_tuner

# A day and an hour of traffic at 1 req/s, but for hour 5 at 4 req/s.
DAY = [4.0 if h == 5 else 1.0 for h in range(25)]
# At the edge of its capacity, 8 running at its cap of 8 and 5 waiting: max_num_seqs holds it back.
CAPPED = {"running_peak": 8.0, "waiting_peak": 5.0, "queue_s_p95": 1.2}


def _settings(trace: Path, **changes):
    return study_settings(trace_path=str(trace), space_text=SEQS_SPACE,
                          trace_selection=TraceSelection(rate_scale=changes.pop("rate_scale", None)), **changes)


def _plan(url: str, tmp_path: Path, trials, options: PlanOptions | None = None, rates=DAY, **settings):
    trace = native_trace(tmp_path / "trace.jsonl", rates)
    return _replan(store_study(url, tmp_path / "artifacts", _settings(trace, **settings), trials),
                   options or PlanOptions())


def _replan(storage, options: PlanOptions):
    repo = storage.repository()
    return plan_capacity(repo, repo.get_study("s1"), load_optuna_study("s1", storage), options)


def _search(url, tmp_path, **kwargs):
    """vLLM's default carries 2 req/s; trial 1 (max_num_seqs 8, at its cap) 3."""
    trials = [scored_trial(0, 2.0, config=EngineConfig()),
              scored_trial(1, 3.0, config=EngineConfig(max_num_seqs=8), **CAPPED)]
    return _plan(url, tmp_path, trials, **kwargs)


def test_a_study_with_nothing_validated_plans_from_capacities_measured_once(url, tmp_path):
    plan = _search(url, tmp_path, options=PlanOptions(gpu_hour_usd=2.0))
    default, best = plan.configurations
    assert (default.role, default.trial, best.role, best.trial) == ("vLLM's default", 0, "recommended", 1)
    assert best.capacity.measured_once and best.capacity_source == "the search, measured once"
    # The peak: the busiest 60 s of hour 5, 4 req/s; at 80% of 3 req/s a replica that is 2 of them.
    assert plan.traffic.peak.rps == pytest.approx(4.0)
    assert plan.traffic.peak_source == "the trace's busiest 60 s window at x1 its recorded rate (the trace as recorded)"
    assert best.peak_replicas.text() == "2 replicas" and default.peak_replicas.text() == "3 replicas"
    # A day: 23 hours of 1 replica and hour 5 of 2, on one CPU slot each, at $2 an hour.
    assert plan.unit == "CPU slot" and best.slots_per_replica == 1
    assert [r.low for r in best.day.replicas] == [2 if h == 5 else 1 for h in range(24)]
    assert best.day.slot_hours == (25.0, 25.0) and best.day.cost_usd == (50.0, 50.0)
    tokens = (23 * 1.0 + 4.0) * 3600 * 100  # the trace's requests ask 100 output tokens each
    assert best.day.cost_per_million_tokens_usd == pytest.approx((50 / (tokens / 1e6),) * 2)
    # The seed's question: its queue grew at the max_num_seqs cap, and the space allows more.
    assert best.remedy.endswith("a setting: raise max_num_seqs (now 8; the space allows up to 256)")
    assert best.remedy.startswith("its queue grew (5 waiting")
    assert json.loads(json.dumps(plan.to_dict()))["configurations"][1]["capacity"]["measured_once"] is True


def test_a_study_that_ran_only_the_default_plans_it_once_as_default_and_recommendation(url, tmp_path):
    plan = _plan(url, tmp_path, [scored_trial(0, 2.0, config=EngineConfig())],
                 options=PlanOptions(peak_rps=10.0, headroom=0.5))
    (only,) = plan.configurations
    assert only.role == "vLLM's default and recommended"
    assert only.peak_replicas.text() == "10 replicas"  # 10 / (2 x 0.5)
    assert plan.traffic.peak_source == "--peak"


def test_a_validated_study_gives_a_range_of_replicas(url, tmp_path):
    launches = [scored_trial(number, value, config=config, mark=ValidationMark(1, r, 2, arm, of))
                for number, (r, arm, of, value, config) in enumerate(
                    [(1, 0, None, 2.0, EngineConfig()), (1, 1, 1, 3.0, EngineConfig(max_num_seqs=8)),
                     (2, 0, None, 2.02, EngineConfig()), (2, 1, 1, 3.03, EngineConfig(max_num_seqs=8))], start=2)]
    trials = [scored_trial(0, 2.0, config=EngineConfig()),
              scored_trial(1, 3.0, config=EngineConfig(max_num_seqs=8), **CAPPED), *launches]
    plan = _plan(url, tmp_path, trials, options=PlanOptions(peak_rps=30.0))
    default, best = plan.configurations
    assert best.capacity_source == "validation 1: 2 launches" and best.capacity.launches == 2
    # Two launches that agree within the search's precision (10%): the interval is that precision either side.
    assert (best.capacity.low, best.capacity.high) == pytest.approx((best.capacity.rps / 1.1, best.capacity.rps * 1.1))
    assert best.peak_replicas.text() == "12 to 14 replicas"  # 30 / (3.33 x 0.8) = 11.3; 30 / (2.74 x 0.8) = 13.7
    assert default.capacity_source == "validation 1: 2 launches"


def test_a_recommendation_in_fp8_is_planned_beside_the_best_at_the_models_own_precision(url, tmp_path):
    trials = [scored_trial(0, 2.0, config=EngineConfig()),
              scored_trial(1, 4.0, config=EngineConfig(quantization="fp8")),
              scored_trial(2, 3.0, config=EngineConfig(max_num_seqs=8), **CAPPED)]
    plan = _plan(url, tmp_path, trials, options=PlanOptions(peak_rps=12.0, headroom=1.0))
    assert [(c.trial, c.role, c.peak_replicas.text()) for c in plan.configurations] == [
        (0, "vLLM's default", "6 replicas"), (1, "recommended", "3 replicas"),
        (2, "best at the model's own precision", "4 replicas")]


def test_a_trace_shorter_than_a_day_gives_no_daily_curve_and_says_so(url, tmp_path):
    trace = native_trace(tmp_path / "trace.jsonl", [1.0, 2.0])
    storage = store_study(url, tmp_path / "artifacts", _settings(trace),
                          [scored_trial(0, 2.0, config=EngineConfig()),
                           scored_trial(1, 3.0, config=EngineConfig(max_num_seqs=8), **CAPPED)])
    plan = _replan(storage, PlanOptions())
    assert plan.traffic.hourly_rps is None and all(c.day is None for c in plan.configurations)
    assert plan.traffic.day_source == ("no daily curve: the trace spans 2 hours, less than a day; give --rates FILE")
    with pytest.raises(TunerError, match="s1: no daily curve: the trace spans 2 hours"):
        _replan(storage, PlanOptions(day=True))
    # A day's rates given by hand plan the day all the same.
    given = _replan(storage, PlanOptions(hourly_rps=(6.0,) * 24, day=True))
    assert given.traffic.day_source == "--rates"
    # Its peak is the day's busiest hour, not the trace's busiest minute.
    assert (given.traffic.peak.rps, given.traffic.peak_source) == (6.0, "the busiest hour of --rates (hour 0)")
    assert given.configurations[1].day.slot_hours == (72.0, 72.0)  # 6 / (3 x 0.8): 3 replicas all day


def test_the_study_scale_is_the_default_and_said(url, tmp_path):
    plan = _search(url, tmp_path, rate_scale=2.0)
    assert plan.traffic.scale == 2.0 and "x2 its recorded rate (the study's rate scale)" in plan.traffic.peak_source
    assert plan.traffic.peak.rps == pytest.approx(8.0)
    # A day replayed twice as fast is still a day: its hours keep the trace's clock, their rates doubled.
    assert plan.traffic.hourly_rps == pytest.approx([8.0 if h == 5 else 2.0 for h in range(24)])
    # (24 x 1 + 4) x 3600 requests
    assert plan.traffic.trace == "the whole trace file trace.jsonl: 100800 requests over 25 hours as recorded"


def test_a_peak_below_one_replicas_capacity_needs_one(url, tmp_path):
    plan = _search(url, tmp_path, options=PlanOptions(peak_rps=0.1))
    assert [c.peak_replicas.text() for c in plan.configurations] == ["1 replica", "1 replica"]


@pytest.mark.parametrize("price", [0.0, -2.0])
def test_a_zero_or_negative_price_is_a_clear_error(price):
    with pytest.raises(TunerError, match=r"--gpu-hour-cost must be above 0 \(US dollars per GPU-hour\)"):
        PlanOptions(gpu_hour_usd=price)


def test_the_plan_is_kept_for_the_dashboard_and_served_with_its_schema(url, tmp_path):
    trace = native_trace(tmp_path / "trace.jsonl", DAY)
    plan = store_study(url, tmp_path / "artifacts", _settings(trace),
                       [scored_trial(0, 2.0, config=EngineConfig()),
                        scored_trial(1, 3.0, config=EngineConfig(max_num_seqs=8), **CAPPED)])
    studies = LocalStudies(plan)
    client = TestClient(build_api(studies, None, None, None))
    answer = client.get("/studies/s1/plan", params={"peak": 30, "gpu_hour_cost": 2.5})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [c["trial"] for c in body["configurations"]] == [0, 1]
    assert body["configurations"][1]["peak_replicas"] == {"low": 13, "high": 13}  # 30 / (3 x 0.8) = 12.5
    assert body["configurations"][1]["day"]["cost_usd"] == [62.5, 62.5]  # 25 slot-hours at $2.5
    assert client.get("/studies/s1/plan", params={"gpu_hour_cost": 0}).json() == {
        "detail": "--gpu-hour-cost must be above 0 (US dollars per GPU-hour), got 0"}
    # Numbers past any traffic or price are refused as bad input, never a server error.
    for bad in ({"peak": "nan"}, {"gpu_hour_cost": "inf"}, {"peak_window_s": "nan"}, {"headroom": "1.5"},
                {"rates": ["1e300"] * 24}, {"rates": ["1"] * 23}):
        assert client.get("/studies/s1/plan", params=bad).status_code == 400, bad
    schema = client.get("/openapi.json").json()
    assert "PlanAnswer" in schema["components"]["schemas"]
    attrs = optuna.load_study(study_name="s1", storage=url).user_attrs[CAPACITY_PLAN_ATTR]
    assert attrs["peak_rps"] == 30.0
    assert attrs["configurations"][1] == "trial 1 (recommended): 13 replicas, 25 CPU slot-hours a day"
    # `--server`: the command line asks the route and prints the same plan as here.
    remote = ServiceClient("http://testserver")
    remote._http = client
    options = PlanOptions(peak_rps=30.0, hourly_rps=(6.0,) * 24, gpu_hour_usd=2.5, headroom=0.5, day=True)
    assert RemoteStudies(remote).capacity_plan("s1", options).to_dict() == \
        studies.capacity_plan("s1", options).to_dict()


def test_the_command_line_prints_the_plan_and_refuses_a_bad_price(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    trace = native_trace(tmp_path / "trace.jsonl", DAY)
    store_study(url, tmp_path / "artifacts", _settings(trace),
                [scored_trial(0, 2.0, config=EngineConfig()),
                 scored_trial(1, 3.0, config=EngineConfig(max_num_seqs=8), **CAPPED)])
    monkeypatch.setenv("COLUMNS", "250")
    common = ["--storage", url, "--artifacts", str(tmp_path / "artifacts")]
    text = run_tuner("study", "plan", "s1", "--gpu-hour-cost", "2", *common).stdout
    assert "peak 4 req/s from the trace's busiest 60 s window" in text
    assert "each replica runs at 80% of its capacity (--headroom)" in text
    assert "3 req/s (measured once)" in text and "a setting: raise max_num_seqs" in text
    assert "replicas hour by hour" in text
    data = json.loads(run_tuner("study", "plan", "s1", "--peak", "12", "--json", *common).stdout)
    assert data["configurations"][1]["peak_replicas"] == {"low": 5, "high": 5}  # 12 / 2.4
    bad = subprocess.run([sys.executable, "-m", "tuner", "study", "plan", "s1", "--gpu-hour-cost", "-1", *common],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["error: --gpu-hour-cost must be above 0 (US dollars per GPU-hour), "
                                               "got -1"]
    rates = tmp_path / "day.csv"
    rates.write_text("hour,rps\n0,1\n")
    bad = subprocess.run([sys.executable, "-m", "tuner", "study", "plan", "s1", "--rates", str(rates), *common],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "a day needs 24 rows" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_nothing_measured_is_a_clear_error(url, tmp_path):
    with pytest.raises(TunerError, match="s1: no configuration was measured within the boundary yet"):
        _plan(url, tmp_path, [replace(scored_trial(0, None), score=None)])


def test_the_report_draws_replicas_against_traffic(tmp_path):
    from tuner.report import collect_report, render_html
    from tuner.report.run_figures import replicas_figure

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    launches = [scored_trial(number, value, config=config, mark=ValidationMark(1, r, 2, arm, of))
                for number, (r, arm, of, value, config) in enumerate(
                    [(1, 0, None, 2.0, EngineConfig()), (1, 1, 1, 3.0, EngineConfig(max_num_seqs=8)),
                     (2, 0, None, 2.02, EngineConfig()), (2, 1, 1, 3.03, EngineConfig(max_num_seqs=8))], start=2)]
    storage = store_study(url, tmp_path / "artifacts", _settings(native_trace(tmp_path / "trace.jsonl", DAY)),
                          [scored_trial(0, 2.0, config=EngineConfig()),
                           scored_trial(1, 3.0, config=EngineConfig(max_num_seqs=8), **CAPPED), *launches])
    data = collect_report("s1", storage)
    fig = replicas_figure(data)
    names = [trace.name for trace in fig.data if trace.showlegend is not False]
    assert names == ["trial 0 (vLLM's default): its capacity's 95% interval",
                     f"trial 0 (vLLM's default): {data.capacity_plan.configurations[0].capacity.text()}",
                     "trial 1 (recommended): its capacity's 95% interval",
                     f"trial 1 (recommended): {data.capacity_plan.configurations[1].capacity.text()}"]
    # The step line at trial 1's central capacity: 1 replica up to 0.8 of it, 2 above.
    central = fig.data[5]
    capacity = data.capacity_plan.configurations[1].capacity.rps
    assert {y for x, y in zip(central.x, central.y) if x <= 0.8 * capacity} == {1}
    assert 'data-figure="replicas"' in render_html(data)
    # A trace shorter than a day (most are) has no hours to scale the axis by: the peak alone does.
    native_trace(Path(data.settings.trace_path), [1.0, 2.0])
    short = collect_report("s1", storage)
    assert short.capacity_plan.traffic.hourly_rps is None and 'data-figure="replicas"' in render_html(short)
    # A study whose trace cannot be read here has no plan to draw: the page leaves the section out.
    Path(data.settings.trace_path).unlink()
    assert 'id="replicas"' not in render_html(collect_report("s1", storage))
