"""Validation on real vLLM (CPU build) and the tiny model: a study whose only other configuration carries far
less than vLLM's default validates it at the end of `study run` (launches stored, marked and interleaved, since the
CPU build has no sleep mode to pair them with, as the verdict says; an interval computed) and keeps the default; an
A/A check of the default against itself gives an interval that includes 1."""

from __future__ import annotations

import csv
import io
import json
from statistics import geometric_mean

import pytest

from conftest import NO_LATENCY_LIMIT_ARGS, run_tuner as tuner
from factories import tiny_space
from tuner.study.events import NO_TIME_LEFT

pytestmark = pytest.mark.vllm

SPACE = tiny_space("validation", {"max_num_seqs": {"type": "int", "low": 1, "high": 4}},
                   description="the tiny model, one sequence at a time or a few")
# At a fixed load with the latency limits lifted every configuration is feasible. The eight requests arrive
# together, so one sequence at a time serves them one after another (550 output tokens in turn) where vLLM's
# default (128 at once) serves them side by side (142 decode steps for the longest), so it completes fewer req/s
# whatever the machine's speed (2.1 and 2.7 against 4.3 and 7.1, beside another test's engine). At a rate either
# keeps up with (x4), both completed about the offered rate, and a busy machine once reversed them (2.93 and
# 2.65 req/s against 3.10 and 1.88).
FIXED = ["--max-requests", "8", "--rate-scale", "100", "--fit", "clip", "--load", "fixed", *NO_LATENCY_LIMIT_ARGS]
# The A/A check searches the capacity coarsely, with short probes from above what the engine carries (about 8
# req/s against about 6 on an idle machine of this kind, 2 on one crowded with other engines), and probes enough
# to find a load it carries on either. Its interval is never narrower than the search's 50% precision, far more
# than two launches of one configuration differ by once interleaved.
SEARCHED = ["--max-requests", "16", "--rate-scale", "6", "--fit", "clip", "--probe-requests", "24",
            "--probe-seconds", "3", "--probe-budget", "6", "--precision", "0.5", "--load-range", "0.005:4",
            *NO_LATENCY_LIMIT_ARGS]

# Five or six launches in one command: about 7 minutes here, more than twice that beside other engines.
MANY_LAUNCHES_S = 2700


@pytest.fixture(scope="module")
def kept(tiny_model, tmp_path_factory) -> dict:
    """vLLM's default (trial 0) and max_num_seqs=1 (trial 1), then the validation `study run` ends with."""
    root = tmp_path_factory.mktemp("validation")
    (root / "space.yaml").write_text(SPACE)
    common = ["--storage", f"sqlite:///{root / 'tuner.db'}", "--artifacts", str(root / "artifacts")]
    tuner("study", "create", "kept", "--model", str(tiny_model), "--space", str(root / "space.yaml"), *FIXED,
          *common)
    tuner("study", "enqueue", "kept", "--set", "max_num_seqs=1", *common)
    run = tuner("study", "run", "kept", "--trials", "2", "--json", *common, timeout_s=MANY_LAUNCHES_S)
    return {"common": common, "run": json.loads(run.stdout)}


def test_validation_launches_are_stored_marked_and_interleaved(kept):
    common = kept["common"]
    summaries = kept["run"]["trials"]
    assert [t["number"] for t in summaries] == [0, 1, 2, 3, 4, 5]
    # The search's two trials, then each configuration twice, round by round: default, trial 1, default, trial 1.
    assert [t["validation"] for t in summaries[:2]] == [None, None]
    assert [(t["validation"]["round"], t["validation"]["of_trial"]) for t in summaries[2:]] == \
        [(1, None), (1, 1), (2, None), (2, 1)]
    assert all(t["state"] == "complete" for t in summaries)
    exported = json.loads(tuner("study", "export", "kept", *common).stdout)
    marks = {t["trial_number"]: t["validation"] for t in exported["trials"]}
    assert marks[0] is None and marks[1] is None
    assert marks[3] == {"run": 1, "round": 1, "repeats": 2, "arm": 1, "of_trial": 1, "paired": False}
    # The validation launches ran in the recorded order, each after the one before it had finished.
    started = {t["trial_number"]: t["started_at"] for t in exported["trials"]}
    finished = {t["trial_number"]: t["finished_at"] for t in exported["trials"]}
    assert all(finished[n] <= started[n + 1] for n in (2, 3, 4))
    assert {t["trial_number"]: t["engine_config"].get("max_num_seqs") for t in exported["trials"]} == \
        {0: None, 1: 1, 2: None, 3: 1, 4: None, 5: 1}
    rows = list(csv.DictReader(io.StringIO(tuner("study", "export", "kept", "--format", "csv", *common).stdout)))
    assert [r["validation"] for r in rows] == ["", "", "1/1/default", "1/1/trial 1", "1/2/default", "1/2/trial 1"]
    # Two search trials and four validation launches; the status states the verdict.
    status = json.loads(tuner("study", "status", "kept", "--json", *common).stdout)
    assert status["trials"] == 6 and status["validation_launches"] == 4
    assert status["validation"].endswith(": keep it")
    # The report lists them with their role.
    report = json.loads(tuner("study", "report", "kept", "--json", *common).stdout)
    roles = {r["trial"]: r["roles"] for r in report["trials"]}
    assert "validation 1, round 2: trial 1" in roles[5] and "default" in roles[0]


def test_a_study_whose_best_is_the_default_says_keep_it_with_the_defaults_command(kept):
    common = kept["common"]
    best = tuner("study", "best", "kept", *common).stdout
    assert "95% CI" in best and "2 repeats each): keep it" in best
    command = next(line.strip() for line in best.splitlines() if line.strip().startswith("vllm serve "))
    assert "--max-num-seqs" not in command  # vLLM's default configuration: the space's fixed values alone
    answer = json.loads(tuner("study", "best", "kept", "--json", *common).stdout)
    validation = answer["validation"]
    assert answer["trial"] == 0 and validation["keep_default"] and validation["recommended"] == "vLLM's default"
    default, single = validation["arms"]
    assert default["trials"] == [2, 4] and single["trials"] == [3, 5] and single["of_trial"] == 1
    # The verdict follows the gain it states, the ratio of the two arms' geometric means. On an idle machine one
    # sequence at a time completes fewer req/s than vLLM's default; with one core kept busy the launches have come
    # out either way (the default's two at 0.79 and 6.30 req/s, x1.31 for one at a time, on 2026-12-05), and two
    # repeats cannot tell them apart: the default stays, "within noise".
    gain = validation["gain"]
    assert gain["repeats"] == [2, 2] and gain["low"] <= gain["ratio"]
    assert gain["high"] is None or gain["ratio"] <= gain["high"]  # None: a launch of trial 1 passed every load it tried
    assert gain["ratio"] == pytest.approx(geometric_mean(single["values"]) / geometric_mean(default["values"]))
    said = ("vLLM's default carries at least as much as the best configuration found (trial 1: x" if gain["ratio"] <= 1
            else "vLLM's default is within noise of the best configuration found (trial 1: x")
    sentence, design = kept["run"]["validation"].splitlines()
    assert sentence.startswith(said) and sentence.endswith(": keep it")
    # The CPU build has no sleep mode: the platform decided for interleaved launches, and the verdict says why.
    assert design == "interleaved launches: vLLM's CPU build has no sleep mode"
    # The report shows where the interval comes from, launch by launch (at a fixed load no bracket is added).
    launches = "; ".join(f"{label} {', '.join(f'{v:.3g}' for v in arm['values'])}"
                         for label, arm in (("vLLM's default", default), ("trial 1", single)))
    report = " ".join(tuner("study", "report", "kept", *common).stdout.split())
    assert f"Launch by launch, in {validation['unit']}: {launches}." in report


def test_a_validation_with_no_time_for_a_launch_starts_none_and_says_so(kept):
    # No launch fits a second: none is started or left queued, and the first validation's verdict stands.
    common = kept["common"]
    answer = json.loads(tuner("study", "validate", "kept", "--timeout", "1", "--json", *common).stdout)
    assert answer["trials"] == [], answer
    assert answer["validation"] == f"not validated: the validation stopped ({NO_TIME_LEFT}); no launch was started"
    status = json.loads(tuner("study", "status", "kept", "--json", *common).stdout)
    assert status["trials"] == 6 and status["validation_launches"] == 4 and status["validation"].endswith(": keep it")
    assert not status["waiting"], "nothing queued"


def test_the_a_a_check_interval_includes_one(tiny_model, tmp_path):
    common = ["--storage", f"sqlite:///{tmp_path / 'tuner.db'}", "--artifacts", str(tmp_path / "artifacts")]
    tuner("study", "create", "aa", "--model", str(tiny_model), *SEARCHED, *common)
    result = json.loads(tuner("study", "validate", "aa", "--against-itself", "--json", *common,
                              timeout_s=MANY_LAUNCHES_S).stdout)
    # The baseline queued at creation runs first, then the default twice per round.
    assert [t["validation"] and t["validation"]["arm"] for t in result["trials"]] == [None, 0, 1, 0, 1]
    assert all(t["state"] == "complete" and t["score"]["capacity"]["rps"] for t in result["trials"])
    sentence, design = result["validation"].splitlines()
    assert sentence.startswith("A/A check: vLLM's default against itself (x")
    assert sentence.endswith("the interval includes 1, as it must for identical configurations")
    assert design == "interleaved launches: vLLM's CPU build has no sleep mode"
    # Each launch starts its search where the baseline's capacity was found: right after the reference load, where
    # the reference's verdict leaves that capacity open (above the reference if it passed, below if it failed; a
    # capacity at the reference load itself was probed by the reference).
    exported = json.loads(tuner("study", "export", "aa", *common).stdout)
    found = exported["trials"][0]["score"]["capacity"]["factor"]
    for launch in exported["trials"][1:]:
        reference, second = launch["probes"][0], launch["probes"][1]
        if found != pytest.approx(1) and (reference["verdict"] == "pass") == (found > 1):
            assert second["factor"] == pytest.approx(found), launch["probes"]
    # An A/A check is no validation of the study's recommendation.
    status = json.loads(tuner("study", "status", "aa", "--json", *common).stdout)
    assert status["validation"] == "not validated" and status["validation_launches"] == 4
