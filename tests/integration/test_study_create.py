"""What `tuner study create` tells people before anything runs: how long each of the study's trials will replay,
so that they can budget the machine's time (a trial of the Qwen2.5-32B Mooncake study outlasted a GPU session)."""

from __future__ import annotations

import json
import re

from conftest import AZURE_CONV, FIXED_LOAD, run_tuner
from tuner.durations import format_duration

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
