"""Trials on a real local Ray: two CPU slots run two real trials at once; a worker killed mid-trial with
ray.kill ends its trial as worker_lost and the configuration is run again; no engine outlives any of it."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import optuna
import pytest

from conftest import AZURE_CONV, vllm_processes
from storage import Repository
from tuner.study import StoragePlan, StudyRunner, create_study, enqueue_config
from tuner.traces.selection import TraceSelection
from workers.engine_config import EngineConfig

pytestmark = pytest.mark.vllm


def _study(tiny_model, tmp_path, name: str) -> StoragePlan:
    plan = StoragePlan.resolve(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    create_study(name, model=tiny_model, trace_path=AZURE_CONV, space="cpu-small", boundary_name="interactive",
                 limits={"ttft_p95_s": 30.0, "e2e_p95_s": 60.0}, plan=plan, seed=0,
                 selection=TraceSelection(max_requests=12, rate_scale=100.0, fit="clip"))
    return plan


def _interval(trial) -> tuple[float, float]:
    start = datetime.fromisoformat(trial.started_at).timestamp()
    return start, start + trial.timings["total_s"]


def test_two_cpu_slots_run_two_real_trials_at_once(tiny_model, tmp_path):
    plan = _study(tiny_model, tmp_path, "pair")
    enqueue_config("pair", plan, EngineConfig(max_num_seqs=8, num_gpu_blocks_override=64,
                                              max_num_batched_tokens=1024))
    slots_seen = []
    report = StudyRunner("pair", plan, parallel=2,
                         on_event=lambda kind, data: slots_seen.append(data["slot"]) if kind == "trial_started" else None
                         ).run(2)
    assert [t.state for t in report.trials] == ["complete", "complete"]
    assert sorted(slots_seen) == [0, 1]
    a, b = (_interval(t) for t in Repository(plan.url).trials("pair"))
    overlap = min(a[1], b[1]) - max(a[0], b[0])
    assert overlap > 0.5 * min(a[1] - a[0], b[1] - b[0]), "the two trials must have run concurrently"
    # Artifacts came back from the workers into the driver's store.
    for n in (0, 1):
        folder = plan.artifact_dir / "trials" / "pair" / f"trial-{n:04d}"
        assert (folder / "server.log").stat().st_size > 0 and (folder / "requests.csv").exists()
    assert not vllm_processes()


def test_a_worker_killed_mid_trial_is_worker_lost_and_its_configuration_reruns(tiny_model, tmp_path):
    plan = _study(tiny_model, tmp_path, "lost")
    killed = threading.Event()
    pool = {}

    def kill_when_serving() -> None:
        deadline = time.monotonic() + 240
        while not any(p.name().startswith("VLLM::EngineCore") for p in vllm_processes()):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(5)  # mid-start or mid-replay: either way the trial is in the worker's hands
        pool["pool"].kill_worker(0)
        killed.set()

    def on_event(kind: str, data: dict) -> None:
        if kind == "pool_ready":
            pool["pool"] = data["pool"]
        elif kind == "trial_started" and data["number"] == 0:
            threading.Thread(target=kill_when_serving, daemon=True).start()

    report = StudyRunner("lost", plan, parallel=1, on_event=on_event).run(1)
    assert killed.is_set()
    assert [(t.number, t.state) for t in report.trials] == [(0, "worker_lost"), (1, "complete")]
    study = optuna.load_study(study_name="lost", storage=plan.url)
    assert study.trials[0].state is optuna.trial.TrialState.FAIL
    assert study.trials[1].params == study.trials[0].params
    assert study.trials[1].user_attrs["baseline"] and study.trials[1].user_attrs["rerun_of"] == 0
    stored = {t.trial_number: t for t in Repository(plan.url).trials("lost")}
    assert stored[0].state == "worker_lost" and stored[0].failure_class == "worker_lost"
    assert stored[1].state == "complete" and stored[1].measurement["completed"] == 12
    assert not vllm_processes()


def test_two_drivers_on_one_study_share_the_work_without_duplicates(tiny_model, tmp_path):
    """Two `tuner study run` processes, each with its own local Ray, on one SQLite study of four queued
    configurations: each configuration is run once and recorded once."""
    import subprocess
    import sys

    plan = _study(tiny_model, tmp_path, "shared")
    queued = [EngineConfig(max_num_seqs=n, num_gpu_blocks_override=64, max_num_batched_tokens=1024) for n in (4, 8, 16)]
    for config in queued:
        enqueue_config("shared", plan, config)
    argv = [sys.executable, "-m", "tuner", "study", "run", "shared", "--trials", "2", "--storage", plan.url,
            "--artifacts", str(plan.artifact_dir)]
    drivers = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for driver in drivers:
        _, err = driver.communicate(timeout=900)
        assert driver.returncode == 0, err[-3000:]
    study = optuna.load_study(study_name="shared", storage=plan.url)
    assert len(study.trials) == 4 and all(t.state is optuna.trial.TrialState.COMPLETE for t in study.trials)
    ran = sorted(t.params.get("max_num_seqs", 0) for t in study.trials)
    assert ran == [0, 4, 8, 16], "the baseline and each queued configuration exactly once"
    stored = Repository(plan.url).trials("shared")
    assert sorted(t.trial_number for t in stored) == [0, 1, 2, 3]
    assert not vllm_processes()
