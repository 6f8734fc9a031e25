"""A run within a budget of slot time (`tuner study run --budget`), on the README's demo study: it plans, keeps to
the budget, says what the budget did not cover, and states what it spent. Four minutes of one CPU slot hold the
default and a search trial or two on this kind of machine, never the validation's four launches on top."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.vllm

BUDGET_S = 240.0
# The run's own end: a trial stopped at the budget's end, the workers' and Ray's shutdown.
STOPPING_S = 45.0


def test_a_run_within_a_budget_plans_keeps_to_it_and_says_what_it_did_not_cover(tmp_path):
    env = {**os.environ, "TUNER_HOME": str(tmp_path / "home")}
    env.pop("TUNER_STORAGE", None)
    env.pop("TUNER_ARTIFACTS", None)
    tuner = [sys.executable, "-m", "tuner", "study"]
    subprocess.run([*tuner, "create", "demo"], env=env, cwd=REPO, check=True, capture_output=True)
    run = subprocess.run([*tuner, "run", "demo", "--budget", "4m"], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=1800)
    said = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == 0, said[-3000:]
    assert ("budget 4m00s of CPU slot time on 1 CPU slot: 4 validation launches to keep time for; no trial measured "
            "yet, so the trials are planned once the first has ended") in said
    # What the budget did not cover, said: the validation (or, on a machine where the default's trial outlasts the
    # budget, the trial stopped at its end).
    uncovered = ("not validated: the validation stopped (the budget left", "stopped at the budget's end",
                 "not validated: study demo has no feasible configuration other than vLLM's default")
    assert any(text in said for text in uncovered), said[-3000:]
    status = json.loads(subprocess.run([*tuner, "status", "demo", "--json"], env=env, capture_output=True, text=True,
                                       check=True).stdout)
    spent = status["spent"]
    assert spent["runs"] == 1 and spent["unit"] == "CPU slot"
    assert 0 < spent["total"]["total_s"] <= BUDGET_S + STOPPING_S, spent
    assert status["validation_launches"] == 0
    assert f"spent {spent['text']}" in said
