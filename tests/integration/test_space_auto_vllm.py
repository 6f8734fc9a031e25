"""`--space auto` on the tiny model and the bundled trace: the derived space is stored with the study as text,
and the study runs on it."""

from __future__ import annotations

import json

import optuna
import pytest

from conftest import FIXED_LOAD
from conftest import run_tuner as tuner
from tuner.storage import Repository

pytestmark = pytest.mark.vllm


def test_a_study_on_a_derived_space_stores_it_and_runs(tiny_model, tmp_path):
    storage = f"sqlite:///{tmp_path / 'tuner.db'}"
    common = ["--storage", storage, "--artifacts", str(tmp_path / "artifacts")]
    selection = ["--max-requests", "8", "--rate-scale", "100", "--fit", "clip"]
    suggested = json.loads(tuner("space", "suggest", "--model", str(tiny_model), *selection, "--json").stdout)
    tuner("study", "create", "auto", "--model", str(tiny_model), "--space", "auto", *selection,
          "--limit", "ttft_p95_s=20", "--limit", "e2e_p95_s=60", *FIXED_LOAD, *common)
    settings = Repository(storage).get_study("auto")
    # Stored as text, like a hand-written space, so that the study stays reproducible.
    assert settings.space_name == "auto" and settings.space_text == suggested["text"]
    assert "# num_gpu_blocks_override: " in settings.space_text and "# max_model_len: " in settings.space_text
    run = json.loads(tuner("study", "run", "auto", "--no-validate", "--trials", "1", "--json", *common).stdout)
    (baseline,) = [t for t in run["trials"] if t["baseline"]]
    assert baseline["state"] == "complete" and baseline["score"]["completion_ratio"] == 1.0
    frozen = optuna.load_study(study_name="auto", storage=storage).trials[0]
    assert frozen.user_attrs["kv_logged_tokens"] == frozen.user_attrs["kv_prediction"]["tokens"]
