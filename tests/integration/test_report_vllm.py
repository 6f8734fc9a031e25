"""Reports on real vLLM (CPU build) and the tiny model: the study report in headless Chromium, `tuner compare`
showing preemptions only where the KV budget cannot hold every sequence at once (at a fixed load), `tuner compare`
searching each setting's capacity (its default, the load search) and giving the verdict the two capacities call
for, and `tuner compare` replaying the same Mooncake requests as recorded and spread."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import pytest

from conftest import AZURE_CONV, FIXED_LOAD, NO_LATENCY_LIMIT_ARGS, REPO, TRACES, run_tuner as tuner
from checks import check_page_in_chromium
from tuner.study.create import enqueue_config
from tuner.study.plan import StoragePlan
from tuner.workers.engine_config import EngineConfig
from factories import azure_slice, tiny_space

pytestmark = pytest.mark.vllm

SPACE = tiny_space("report-study", {
    "max_num_seqs": {"type": "int", "low": 2, "high": 16},
    "num_gpu_blocks_override": {"type": "int", "low": 4, "high": 96},
    "max_num_batched_tokens": {"type": "categorical", "choices": [256, 1024, 2048]},
}, description="the tiny model under KV pressure")
# Run after the baseline (trial 0): one whose KV cache cannot hold a request (refused before launch), one that
# preempts.
KV_INSUFFICIENT = EngineConfig(max_num_seqs=8, max_num_batched_tokens=1024, num_gpu_blocks_override=4)
PRESSURED = EngineConfig(max_num_seqs=16, max_num_batched_tokens=1024, num_gpu_blocks_override=12)
# Eight requests arriving together (prompts of 350 to 630 tokens, answers filling each to about 1,024 tokens).
# 12 blocks hold one such sequence and a half, so any two admitted together outgrow them. With 24 blocks (three
# sequences), one CI run on a crowded machine saw no preemption at all: its front end passed the requests to the
# engine a few at a time.
REQUESTS = 8
SLICE = ["--trace", str(AZURE_CONV), *azure_slice(REQUESTS)]



@pytest.fixture(scope="module")
def study(tiny_model, tmp_path_factory):
    """Three trials: vLLM's defaults, a KV cache too small to start (refused before launch, costing no trial of
    the budget), and one that preempts."""
    root = tmp_path_factory.mktemp("report")
    (root / "space.yaml").write_text(SPACE)
    storage = f"sqlite:///{root / 'tuner.db'}"
    common = ["--storage", storage, "--artifacts", str(root / "artifacts")]
    tuner("study", "create", "r", "--model", str(tiny_model), *SLICE, "--space", str(root / "space.yaml"),
          "--limit", "ttft_p95_s=20", "--limit", "e2e_p95_s=60", "--seed", "3", *FIXED_LOAD, *common)
    plan = StoragePlan.resolve(storage, root / "artifacts")
    for config in (KV_INSUFFICIENT, PRESSURED):
        enqueue_config("r", plan, config)
    # The report draws the boundary, so the limits stay; pruning is off, so that the pressured trial runs to its
    # end however loaded the machine.
    tuner("study", "run", "r", "--no-validate", "--trials", "2", "--no-prune", *common)
    return {"root": root, "common": common}


def test_study_report_renders_in_headless_chromium_with_every_plot(study):
    page = study["root"] / "report.html"
    text = tuner("study", "report", "r", "--html", str(page), *study["common"]).stdout
    # The same summary in the terminal, the recommendation with its boundary, machine, trace and vLLM.
    assert "Recommended for the interactive (p95 TTFT <= 20 s, p95 e2e <= 60 s, completion >= 99%) boundary" in text
    assert "Measured on CPU:" in text and "vLLM 0.32.0" in text and "azure_conv_2023.csv" in text
    assert "vllm serve " in text and "kv_insufficient" in text and f"report written to {page}" in text
    data = json.loads(tuner("study", "report", "r", "--json", *study["common"]).stdout)
    rows = {r["trial"]: r for r in data["trials"]}
    assert sorted(rows) == [0, 1, 2] and "default" in rows[0]["roles"]
    assert rows[1]["failure_class"] == "kv_insufficient (predicted)" and rows[1]["state"] == "infeasible"
    assert rows[2]["preemptions"] > 0 and rows[2]["kv_tokens"] == 12 * 128  # as vLLM logged it
    assert data["recommendation"]["hardware"]["cpu_cores"] >= 1 and data["recommendation"]["vllm_version"] == "0.32.0"
    assert data["pareto"] and data["recommendation"]["trial"] in data["pareto"]

    found = check_page_in_chromium(page, REPO / "test-artifacts" / "report.png")
    featured = {0, data["recommendation"]["trial"]}
    timelines = any((study["root"] / "artifacts" / "trials" / "r" / f"trial-{n:04d}" / "timeline.csv").is_file()
                    for n in featured)
    expected = {"pareto", "preemptions", "time_split", "output_lengths"} | ({"timelines"} if timelines else set())
    assert set(found["figures"]) == expected
    assert ("no timeline recorded" in page.read_text()) is not timelines


def test_compare_shows_preemptions_only_for_the_larger_max_num_seqs(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # the table as a wide terminal shows it, rows unwrapped
    # 12 blocks of 128 tokens hold 1,536 tokens: one sequence of at most 1,024 always fits; any two admitted
    # together are preempted as their answers grow, however the machine spaces their arrival at the engine.
    result = tuner("compare", "--model", str(tiny_model), *SLICE, "--set", "max_model_len=1024",
                   "--set", "enforce_eager=true", "--set", "kv_cache_memory_bytes=268435456",
                   "--set", "num_gpu_blocks_override=12", "--vary", "max_num_seqs=1,16", *FIXED_LOAD,
                   "--out", str(tmp_path))
    # What people read: the table, the verdict, the machine, the trace and what was held equal.
    text = result.stdout
    for line in ("max_num_seqs, one value at a time", "preemptions", "queue time mean / p95 s (vLLM)", "Verdict",
                 "measured on CPU", "vLLM 0.32.0", "azure_conv_2023.csv",
                 "held for every value: max_model_len=1024", "num_gpu_blocks_override=12", "enforce_eager=True",
                 "judged against the interactive (p95 TTFT <= 2 s"):
        assert line in text, line
    # What programs read: the same comparison as `--json` prints it, kept beside the runs' records.
    data = json.loads((tmp_path / "compare.json").read_text())
    few, many = data["runs"]
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    (REPO / "test-artifacts" / "compare-max_num_seqs.json").write_text(json.dumps(
        {r["label"]: {"preemptions": r["measurement"]["preemptions"], "completed": r["measurement"]["completed"],
                      "e2e_p95_s": r["measurement"]["e2e_s"]["p95"], "ttft_p95_s": r["measurement"]["ttft_s"]["p95"],
                      "queue_s_mean": r["measurement"]["queue_s_mean"]} for r in data["runs"]}
        | {"verdicts": data["verdicts"]}, indent=2))
    assert (few["label"], many["label"]) == ("max_num_seqs=1", "max_num_seqs=16")
    assert few["served"] and many["served"]
    assert few["measurement"]["preemptions"] == 0
    assert many["measurement"]["preemptions"] > 0
    assert few["measurement"]["completed"] == many["measurement"]["completed"] == REQUESTS
    # vLLM's running gauge, sampled: never above the cap, but a busy machine's /metrics can answer too seldom to
    # catch the larger one's peak, so only the bound is certain.
    assert few["measurement"]["running_peak"] <= 1 and many["measurement"]["running_peak"] <= 16
    assert "--max-num-seqs 1" in few["serve_command"] and "--num-gpu-blocks-override 12" in many["serve_command"]
    (verdict,) = data["verdicts"]
    assert verdict in " ".join(text.split())
    assert verdict.startswith(f"max_num_seqs=16 rather than 1: brought preemptions (0 → "
                              f"{many['measurement']['preemptions']})")
    assert "p95 end-to-end" in verdict
    assert data["measured_on"]["vllm_version"] == "0.32.0" and data["measured_on"]["description"].startswith("CPU")
    assert (tmp_path / "max_num_seqs=16" / "measurement.json").is_file()


def test_compare_searches_each_capacity_and_gives_the_verdict_they_call_for(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    # Short prompts and long answers, 2 req/s: decoding is the work, and on an idle machine eight sequences
    # decoded together carry several times the load one at a time does (8.10 against 2.91 req/s). Not always on
    # a crowded one: beside another test's engines both stalled at the same 3.46 req/s (2026-12-05), and with one
    # core kept busy both did in one run and differed x6.6 in the next. So the test asserts what holds on any
    # machine: each search ran its own setting, and the verdict is the one its two capacities call for. With the
    # latency limits lifted a probe is judged by whether the engine kept up and served every request.
    trace = tmp_path / "decode-heavy.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.5, "input_tokens": 32, "output_tokens": 96}) + "\n"
                             for i in range(12)))
    result = tuner("compare", "--model", str(tiny_model), "--trace", str(trace), "--set", "max_model_len=1024",
                   "--set", "enforce_eager=true", "--set", "kv_cache_memory_bytes=268435456",
                   "--vary", "max_num_seqs=1,8", *NO_LATENCY_LIMIT_ARGS, "--probe-requests", "16",
                   "--probe-seconds", "10", "--probe-budget", "4", "--out", str(tmp_path / "out"))
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for line in ("max_num_seqs=1: load probes", "max_num_seqs=8: load probes", "offered req/s", "capacity: ",
                 "capacity req/s (x the trace's rate)", "how the search ended", "at the reference load", "Verdict"):
        assert line in text, line
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    few, many = data["runs"]
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    (REPO / "test-artifacts" / "compare-capacity-max_num_seqs.txt").write_text(result.stdout)
    (REPO / "test-artifacts" / "compare-capacity-max_num_seqs.json").write_text(json.dumps(
        {r["label"]: {"capacity": r["capacity"], "probes": [(p["factor"], p["measurement"]["offered_rps"],
                                                             p["verdict"], p["reasons"]) for p in r["probes"]]}
         for r in data["runs"]} | {"verdicts": data["verdicts"]}, indent=2))
    assert data["load"]["mode"] == "search" and data["load"]["probe_budget"] == 4
    for run in (few, many):
        assert 2 <= len(run["probes"]) <= 4 and run["capacity"]["probes"] == len(run["probes"])
        assert run["probes"][0]["factor"] == 1.0 and run["probes"][0]["requests"] >= 16
        assert run["capacity"]["rps"] is not None, run["capacity"]
    for run, seqs in ((few, 1), (many, 8)):  # vLLM's own log of the settings it was given
        log = (tmp_path / "out" / run["label"] / "server.log").read_text()
        assert re.search(rf"non-default args: {{.*'max_num_seqs': {seqs}[,}}]", log), run["label"]
    (verdict,) = data["verdicts"]
    assert verdict in text
    low, high = sorted((few["capacity"]["rps"], many["capacity"]["rps"]))
    if high <= low * (1 + data["load"]["precision"]):  # the search cannot tell them apart, and says so
        assert verdict.startswith("max_num_seqs=8 rather than 1: about the same capacity, "), verdict
    else:
        more = "more" if many["capacity"]["rps"] > few["capacity"]["rps"] else "less"
        assert verdict.startswith(f"max_num_seqs=8 rather than 1: carries {more}, "), verdict


def test_compare_replays_the_same_requests_as_recorded_and_spread(tiny_model, tmp_path):
    # Mooncake's first 20 requests: ten recorded at 0 s, the rest in instants 3 s apart; lengths scaled to the tiny
    # model's context. Recorded, each instant's requests reach the engine together; spread, one after another.
    # A KV budget of its own: the CPU build's default share of RAM is refused beside other tests' engines.
    mooncake = ["--trace", str(TRACES / "mooncake_conversation_trace.jsonl"), "--max-requests", "20",
                "--fit", "scale", "--set", "enforce_eager=true", "--set", "kv_cache_memory_bytes=268435456"]
    result = tuner("compare", "--model", str(tiny_model), *mooncake, "--vary", "arrivals=recorded,spread",
                   *FIXED_LOAD, *NO_LATENCY_LIMIT_ARGS, "--out", str(tmp_path), "--json")
    data = json.loads(result.stdout)
    recorded, spread = data["runs"]
    assert (recorded["label"], spread["label"]) == ("arrivals=recorded", "arrivals=spread")
    assert recorded["served"] and spread["served"]
    steps = [run["trace"]["transformations"] for run in (recorded, spread)]
    assert not any(s.startswith("spread(") for s in steps[0])
    assert steps[1][0].startswith("spread(")  # stated in the result, as the trace's first step
    # The same requests, side by side: only when they arrived differs.
    asked = [[(r["input_tokens"], r["requested_tokens"]) for r in csv.DictReader(
        (tmp_path / run["label"] / "requests.csv").open())] for run in (recorded, spread)]
    assert sorted(asked[0]) == sorted(asked[1]) and len(asked[0]) == 20
    sent = [[float(r["scheduled_s"]) for r in csv.DictReader((tmp_path / run["label"] / "requests.csv").open())]
            for run in (recorded, spread)]
    assert len(set(sent[0])) < len(set(sent[1])) == 20
    (verdict,) = data["verdicts"]
    ttft = [run["measurement"]["ttft_s"]["p95"] for run in (recorded, spread)]
    assert verdict.startswith("arrivals=spread rather than recorded: ") and "p95 TTFT" in verdict, verdict
    assert all(t is not None and t > 0 for t in ttft)
    # A window that starts inside a recorded instant would compare other requests: refused before any launch.
    refused = subprocess.run([sys.executable, "-m", "tuner", "compare", "--model", str(tiny_model), *mooncake,
                              "--window", "1.5:", "--vary", "arrivals=recorded,spread", *FIXED_LOAD, "--out",
                              str(tmp_path / "refused")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "starts inside a recorded instant" in refused.stderr, refused.stderr
    assert not (tmp_path / "refused").exists()
