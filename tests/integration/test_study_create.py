"""What `tuner study create` tells people before anything runs: how long each of the study's trials will replay,
so that they can budget the machine's time (a trial of the Qwen2.5-32B Mooncake study outlasted a GPU session)."""

from __future__ import annotations

import json
import re

from conftest import AZURE_CONV, FIXED_LOAD, run_tuner
from tuner.common.durations import format_duration

# 16 requests of the Azure conversation cut, 100 times as fast as recorded.
SELECTION = ("--trace", str(AZURE_CONV), "--window", "300:400", "--max-requests", "16", "--rate-scale", "100",
             "--fit", "clip")


def test_a_new_study_says_how_long_each_probe_replays_and_how_many_a_trial_runs(tiny_model, tmp_path):
    common = ["--model", str(tiny_model), *SELECTION, "--storage", f"sqlite:///{tmp_path / 'tuner.db'}"]
    searched = ["--probe-requests", "80", "--probe-seconds", "20", "--probe-budget", "3"]
    created = json.loads(run_tuner("study", "create", "searched", *common, *searched, "--json").stdout)
    length = created["probe_length"]
    # The trace repeated until it holds 80 requests and lasts 20 s: 5 copies of 16 at least. Every other probe's
    # arrivals last the 20 s at least, since one copy of the trace at 100 times its rate lasts less than a second.
    assert length["requests"] >= 80 and length["requests"] % 16 == 0 and length["arrival_s"] >= 20
    assert length["probes"] == 3 and abs(length["offered_rps"] * length["arrival_s"] - length["requests"]) < 1e-6
    assert length["least_arrival_s"] == 20 and length["trial_arrival_s"] == length["arrival_s"] + 2 * 20
    said = " ".join(run_tuner("study", "create", "said", *common, *searched).stdout.split())
    assert (f"each probe replays {length['requests']} requests over {format_duration(length['arrival_s'])} of "
            f"arrivals ({length['offered_rps']:.3g} req/s) at the reference load and at least 20s of arrivals at any "
            f"other, and ends within the request timeout (10m00s) of its last arrival") in said, said
    assert (f"a trial runs up to 3 probes (a validation launch 6): at least "
            f"{format_duration(length['trial_arrival_s'])} of arrivals when it spends them") in said

    once = run_tuner("study", "create", "once", *common, *FIXED_LOAD, "--request-timeout", "90")
    said = " ".join(once.stdout.split())
    # The 16 requests arrive within a fraction of a second at 100 times their recorded rate.
    assert re.search(r"each trial replays 16 requests over 0\.\d+s of arrivals \(\d+ req/s\) and ends within the "
                     r"request timeout \(1m30s\) of its last arrival", said), said


def test_with_no_trace_a_study_is_the_demo_and_every_option_given_overrides_it(tiny_model, tmp_path):
    storage = ["--model", str(tiny_model), "--storage", f"sqlite:///{tmp_path / 'tuner.db'}"]
    demo = json.loads(run_tuner("study", "create", "demo", *storage, "--json").stdout)
    assert demo["trace_path"].endswith("azure_conv_2023_first1000.csv")
    assert (demo["trace_selection"]["max_requests"], demo["trace_selection"]["rate_scale"],
            demo["trace_selection"]["fit"]) == (16, 6.0, "clip")
    # The load search goes below the demo's traffic as far as the machine needs: a 256th of it at the least.
    assert (demo["load"]["precision"], demo["load"]["probe_seconds"], demo["load"]["min_factor"]) == (0.25, 10.0,
                                                                                                       1 / 256)
    ten_times = json.loads(run_tuner("study", "create", "faster", *storage, "--rate-scale", "60", "--precision", "0.1",
                                     "--json").stdout)
    assert ten_times["trace_selection"]["rate_scale"] == 60.0 and ten_times["trace_selection"]["max_requests"] == 16
    assert ten_times["load"]["precision"] == 0.1 and ten_times["load"]["probe_seconds"] == 10.0
    # A trace of your own is replayed whole, at its recorded rate, with the general defaults (fitted here: the
    # cpu-small space's context is shorter than the trace's longest request).
    own = json.loads(run_tuner("study", "create", "own", *storage, "--trace", str(AZURE_CONV), "--window", "0:60",
                               "--fit", "clip", "--json").stdout)
    assert own["trace_selection"]["max_requests"] is None and own["trace_selection"]["rate_scale"] is None
    assert (own["load"]["precision"], own["load"]["probe_seconds"]) == (0.1, 20.0)
