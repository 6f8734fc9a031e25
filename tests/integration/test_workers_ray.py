"""Trials on a real Ray: two CPU slots run two real trials at once; a worker killed mid-trial with ray.kill ends
its trial as worker_lost and the configuration is run again; a SIGINT stops both trials in flight; a trial
killed on another node of a multi-node cluster still brings its log back; no engine outlives any of it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import ray

from conftest import AZURE_CONV, NO_LATENCY_LIMITS, as_at_a_terminal, run_tuner, signal_when_ready, vllm_processes
from tuner.storage import Repository
from tuner.common.errors import TunerError
from tuner.study.create import create_study, enqueue_config
from tuner.study.events import PoolReady, RunEvent, TrialStarted, WorkerDone
from tuner.study.plan import StoragePlan
from tuner.study.runner import StudyRunner
from tuner.analysis.capacity import LoadPolicy
from tuner.traces.selection import TraceSelection, load_trace
from tuner.workers.engine_config import EngineConfig
from tuner.workers.pool import WorkerLost, WorkerPool, _staging_dir
from tuner.workers.trial import TrialSpec

pytestmark = pytest.mark.vllm

# A configuration other than the baseline, queued to run right after it.
QUEUED = EngineConfig(max_num_seqs=8, num_gpu_blocks_override=64, max_num_batched_tokens=1024)


def _study(tiny_model, tmp_path, name: str, rate_scale: float = 100.0) -> StoragePlan:
    plan = StoragePlan.resolve(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    create_study(name, model=tiny_model, trace_path=AZURE_CONV, space="cpu-small", boundary_name="interactive",
                 limits=NO_LATENCY_LIMITS, plan=plan, seed=0, load=LoadPolicy.fixed(),
                 selection=TraceSelection(max_requests=12, rate_scale=rate_scale, fit="clip"))
    return plan


def _trial_dir(plan: StoragePlan, name: str, number: int) -> Path:
    return plan.artifact_dir / "trials" / name / f"trial-{number:04d}"


def _wait_for_log(log: Path, line: str, alive=lambda: True, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and line in log.read_text(errors="replace")):
        assert alive() and time.monotonic() < deadline, f"{line!r} never reached {log}"
        time.sleep(0.1)


def _interval(trial) -> tuple[float, float]:
    start = datetime.fromisoformat(trial.started_at).timestamp()
    return start, start + trial.timings.total_s


def test_a_worker_killed_mid_trial_is_worker_lost_and_its_configuration_reruns(tiny_model, tmp_path):
    plan = _study(tiny_model, tmp_path, "lost")
    enqueue_config("lost", plan, QUEUED)  # trial 1, after the baseline: the one killed
    killed = threading.Event()
    pool = {}
    scheduling_s = {}

    def kill_when_serving() -> None:
        # On local Ray the worker writes straight into the driver's trial folder.
        # Mid-start, at once: the trial is in the worker's hands. A pause here once outlasted the rest of the trial
        # (the engine ready 3 s after its core's first line, the replay done 1.1 s later), so nothing was killed.
        _wait_for_log(_trial_dir(plan, "lost", 1) / "server.log", "(EngineCore pid=")
        pool["pool"].kill_worker(0)
        killed.set()

    def on_event(event: RunEvent) -> None:
        match event:
            case PoolReady():
                pool["pool"] = event.pool
            case TrialStarted(number=1):
                threading.Thread(target=kill_when_serving, daemon=True).start()
            case WorkerDone():
                scheduling_s[event.number] = event.scheduling_s

    report = StudyRunner("lost", plan, parallel=1, on_event=on_event).run(2)
    assert killed.is_set()
    # From the slot freeing (trial 1 lost) to the re-run's engine launch: a new worker, storing and asking.
    assert scheduling_s[0] is None and 0 < scheduling_s[2] < 60
    assert [(t.number, t.state) for t in report.trials] == [(0, "complete"), (1, "worker_lost"), (2, "complete")]
    study = optuna.load_study(study_name="lost", storage=plan.url)
    assert study.trials[1].state is optuna.trial.TrialState.FAIL
    searched = {"max_num_seqs": 8, "num_gpu_blocks_override": 64, "max_num_batched_tokens": 1024}
    assert study.trials[1].params == searched and study.trials[2].params == searched
    assert study.trials[2].user_attrs["rerun_of"] == 1 and "baseline" not in study.trials[2].user_attrs
    stored = {t.trial_number: t for t in Repository(plan.url).trials("lost")}
    assert stored[1].state == "worker_lost" and stored[1].failure_class == "worker_lost"
    assert stored[2].state == "complete" and stored[2].measurement.completed == 12
    assert stored[2].engine_config.max_num_seqs == 8
    # The killed trial's log, up to its engine core's start at least, is in the driver's store all the same.
    assert "(EngineCore pid=" in (_trial_dir(plan, "lost", 1) / "server.log").read_text(errors="replace")
    assert not vllm_processes()


def test_two_drivers_on_one_study_share_the_work_without_duplicates(tiny_model, tmp_path):
    """Two `tuner study run` processes, each with its own local Ray, started together on one SQLite study of two
    queued configurations (the baseline and one other), one trial each: both ask for a trial at once, and each
    configuration is run once and recorded once. (Four drivers share a PostgreSQL study in
    test_postgres_drivers.py.)"""
    plan = _study(tiny_model, tmp_path, "shared")
    enqueue_config("shared", plan, QUEUED)
    argv = [sys.executable, "-m", "tuner", "study", "run", "shared", "--trials", "1", "--storage", plan.url,
            "--no-validate", "--artifacts", str(plan.artifact_dir)]
    drivers = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for driver in drivers:
        _, err = driver.communicate(timeout=900)
        assert driver.returncode == 0, err[-3000:]
    study = optuna.load_study(study_name="shared", storage=plan.url)
    assert len(study.trials) == 2 and all(t.state is optuna.trial.TrialState.COMPLETE for t in study.trials)
    ran = sorted(t.params.get("max_num_seqs", 0) for t in study.trials)
    assert ran == [0, QUEUED.max_num_seqs], "the baseline and the queued configuration exactly once"
    stored = Repository(plan.url).trials("shared")
    assert sorted(t.trial_number for t in stored) == [0, 1]
    assert not vllm_processes()


@pytest.fixture(scope="module")
def stopped(tiny_model, tmp_path_factory) -> dict:
    """Study `stopped`: a `tuner study run --parallel 2` interrupted by SIGINT once both of its engines (the
    baseline's and QUEUED's) are up, then the next run, on two CPU slots, re-running both at once."""
    # The 12 requests at a fifth of their recorded rate span about 48 s: the first trial is still replaying when
    # the second engine is up. At a high rate a replay lasts 3 s, and at half the rate 19 s: with one core kept
    # busy the two engines, started together, came up 29 s apart, and the first trial had ended (2026-12-05).
    tmp_path = tmp_path_factory.mktemp("stopped")
    plan = _study(tiny_model, tmp_path, "stopped", rate_scale=0.2)
    enqueue_config("stopped", plan, QUEUED)
    common = ["--storage", plan.url, "--artifacts", str(plan.artifact_dir)]
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "study", "run", "stopped", "--no-validate", "--trials", "2",
                             "--parallel", "2", "--json", *common],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_at_a_terminal)
    logs = [_trial_dir(plan, "stopped", n) / "server.log" for n in (0, 1)]
    def both_engines_up() -> None:
        for log in logs:
            _wait_for_log(log, "Application startup complete", alive=lambda: proc.poll() is None, timeout_s=300)

    stdout, stderr = signal_when_ready(proc, both_engines_up, signal.SIGINT)
    stopped = {"plan": plan, "logs": logs, "returncode": proc.returncode, "stdout": stdout, "stderr": stderr}
    deadline = time.monotonic() + 10
    while vllm_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    stopped["engines_left"] = [p.pid for p in vllm_processes()]
    if stopped["engines_left"]:  # the SIGINT test fails on it; the next run must not count them
        return stopped

    # The next run, as a user starts it, on two CPU slots: the two re-runs at once, each trial's start (with its
    # slot) in its events.
    events = tmp_path / "rerun-events.jsonl"
    stopped["rerun"] = json.loads(run_tuner("study", "run", "stopped", "--no-validate", "--trials", "2", "--parallel",
                                            "2", "--json", "--events", str(events), *common).stdout)
    stopped["slots_seen"] = [e["slot"] for e in map(json.loads, events.read_text().splitlines())
                             if e["kind"] == "trial_started"]
    stopped["engines_left_after_rerun"] = [p.pid for p in vllm_processes()]
    return stopped


def test_two_cpu_slots_run_two_real_trials_at_once(stopped):
    assert "rerun" in stopped, f"vLLM left behind by the stopped run: {stopped['engines_left']}"
    plan, report = stopped["plan"], stopped["rerun"]
    assert [t["state"] for t in report["trials"]] == ["complete", "complete"]
    assert sorted(stopped["slots_seen"]) == [0, 1]
    reruns = [t for t in Repository(plan.url).trials("stopped") if t.trial_number in (2, 3)]
    a, b = (_interval(t) for t in reruns)
    overlap = min(a[1], b[1]) - max(a[0], b[0])
    assert overlap > 0.5 * min(a[1] - a[0], b[1] - b[0]), "the two trials must have run concurrently"
    # The artifacts are in the driver's store.
    for n in (2, 3):
        folder = _trial_dir(plan, "stopped", n)
        assert (folder / "server.log").stat().st_size > 0 and (folder / "requests.csv").exists()
    assert not stopped["engines_left_after_rerun"]


def test_sigint_stops_both_trials_in_flight_and_the_next_run_reruns_them(stopped):
    plan, logs = stopped["plan"], stopped["logs"]
    assert stopped["returncode"] == 130, stopped["stderr"][-3000:]
    report = json.loads(stopped["stdout"])
    reason = "the run was stopped (SIGINT)"
    assert sorted((t["number"], t["state"], t["reason"]) for t in report["trials"]) == [(0, "stopped", reason),
                                                                                         (1, "stopped", reason)]
    assert not stopped["engines_left"]
    assert all("Application startup complete" in log.read_text(errors="replace") for log in logs)

    study = optuna.load_study(study_name="stopped", storage=plan.url)
    reruns = {t.user_attrs["rerun_of"]: t for t in study.trials[2:]}
    assert sorted(reruns) == [0, 1] and len(study.trials) == 4
    for number, rerun in reruns.items():
        assert rerun.state is optuna.trial.TrialState.COMPLETE and rerun.params == study.trials[number].params
    assert reruns[1].params == {"max_num_seqs": 8, "num_gpu_blocks_override": 64, "max_num_batched_tokens": 1024}
    assert not stopped["engines_left_after_rerun"]


def test_by_default_the_pool_takes_the_slots_free_now():
    # Logical GPUs: Ray counts them without a device, and counting is all that is checked here.
    with WorkerPool(tensor_parallel_size=2, local_gpus=5) as first:
        assert [slot.gpus for slot in first.slots] == [2, 2]
        assert all(first.node_id(slot.index) for slot in first.slots)  # both actors placed: 4 GPUs taken
        deadline = time.monotonic() + 30
        while ray.available_resources().get("GPU", 0) != 1:
            assert time.monotonic() < deadline, ray.available_resources()
            time.sleep(0.2)
        with WorkerPool(tensor_parallel_size=1) as second:
            assert [slot.gpus for slot in second.slots] == [1], "one GPU is free, not five"
        with WorkerPool(3) as waiting:
            assert len(waiting.slots) == 3, "asked for, slots wait for room the cluster has"
        with pytest.raises(TunerError, match="room for 5"):
            WorkerPool(6)
        with pytest.raises(TunerError, match="free now"):
            WorkerPool(tensor_parallel_size=2)
    assert not ray.is_initialized()


def test_a_trial_killed_on_another_node_is_brought_back_and_its_slot_moves_to_a_live_other_node(tiny_model,
                                                                                                 tmp_path):
    """Ray's own multi-node cluster on this machine: the driver's node has no CPU, so the slot's worker runs on
    another node and writes into its staging folder there."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    first = cluster.add_node(num_cpus=1)
    out_dir = tmp_path / "trials" / "far" / "trial-0000"
    staged = _staging_dir(out_dir)
    trace = load_trace(AZURE_CONV, TraceSelection(max_requests=12, rate_scale=0.5, fit="clip"), 1024)
    config = EngineConfig(enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=268435456)
    try:
        with WorkerPool(1, ray_address=cluster.address) as pool:
            lost = pool.node_id(0)
            assert lost == first.node_id != ray.get_runtime_context().get_node_id()
            running = pool.submit(0, TrialSpec(tiny_model, trace, config, out_dir))
            _wait_for_log(staged / "server.log", "Application startup complete")
            pool.kill_worker(0)
            with pytest.raises(WorkerLost):
                ray.get(running, timeout=60)
            cluster.add_node(num_cpus=1)
            deadline = time.monotonic() + 30
            while ray.available_resources().get("CPU", 0) < 2:  # the lost node's CPU and the new node's
                assert time.monotonic() < deadline, ray.available_resources()
                time.sleep(0.2)
            pool.replace_worker(0)
            assert "Application startup complete" in (out_dir / "server.log").read_text(errors="replace")
            assert not staged.parent.exists(), "the staging folder, and the empty ones above it, are deleted"
            assert pool.node_id(0) not in (None, lost), "the replacement must prefer the other live node"
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert not vllm_processes()
