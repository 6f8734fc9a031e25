"""Real vLLM launches that fail, each named for what it is, and a driver that is interrupted or killed:
no engine process outlives any of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import AZURE_CONV, FIXED_LOAD, as_at_a_terminal, vllm_processes
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import FailureClass
from tuner.workers.launch import EngineLaunchError, start_engine

pytestmark = pytest.mark.vllm


def _launch_failure(model, config, tmp_path, **kwargs):
    with pytest.raises(EngineLaunchError) as caught:
        start_engine(model, config, tmp_path / "server.log", **kwargs)
    return caught.value.failure


def test_memory_reservation_beyond_the_machine_is_load_oom(tiny_model, tmp_path):
    failure = _launch_failure(tiny_model, EngineConfig(gpu_memory_utilization=0.99, enforce_eager=True), tmp_path)
    assert failure.kind is FailureClass.LOAD_OOM, failure.message
    assert "memory" in failure.log_excerpt.lower()


def test_settings_vllm_rejects_are_invalid_config(tiny_model, tmp_path):
    config = EngineConfig(max_num_seqs=16, max_num_batched_tokens=4, kv_cache_memory_bytes=10**8)
    failure = _launch_failure(tiny_model, config, tmp_path)
    assert failure.kind is FailureClass.INVALID_CONFIG
    assert "max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (16)" in failure.message


def test_no_health_in_time_is_startup_timeout(tiny_model, tmp_path):
    failure = _launch_failure(tiny_model, EngineConfig(enforce_eager=True, kv_cache_memory_bytes=10**8), tmp_path,
                              startup_timeout_s=3)
    assert failure.kind is FailureClass.STARTUP_TIMEOUT


def _cli_trial(tiny_model, tmp_path) -> subprocess.Popen:
    """A CLI trial long enough to be caught mid-replay: 40 requests at the recorded rate."""
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "trial", "run", "--model", str(tiny_model), "--trace", str(AZURE_CONV),
         "--max-requests", "40", "--fit", "clip", *FIXED_LOAD, "--set", "max_model_len=1024",
         "--set", "enforce_eager=true",
         "--set", "kv_cache_memory_bytes=268435456", "--out", str(tmp_path), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_at_a_terminal)


def _wait_for_replay(tmp_path, proc, timeout_s=240):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = tmp_path / "server.log"
        if log.exists() and "POST /v1/completions" in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.5)
    raise AssertionError("the replay never started")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_driver_stops_its_engine(tiny_model, tmp_path, sig):
    proc = _cli_trial(tiny_model, tmp_path)
    _wait_for_replay(tmp_path, proc)
    engines = vllm_processes()
    assert engines, "the engine should be running mid-replay"
    # Every engine on this node compiles into (and loads from) tuner's one cache folder.
    home = os.environ.get("TUNER_HOME") or str(Path.home() / ".local" / "share" / "tuner")
    assert {p.environ().get("VLLM_CACHE_ROOT") for p in engines} == {str(Path(home) / "engine-cache")}
    # A CPU engine as tuner launches it: its worker inside the engine core (no process of its own), on one OpenMP
    # thread of this machine's two cores (tuner/workers/cpu_engine.py).
    assert {(p.environ().get("VLLM_ENABLE_V1_MULTIPROCESSING"), p.environ().get("OMP_NUM_THREADS"))
            for p in engines} == {("0", "1")}
    assert not any("Worker" in p.name() for p in engines), [p.name() for p in engines]
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode != 0


def test_killed_driver_takes_its_engine_down(tiny_model, tmp_path):
    # SIGKILL runs no handler of ours: the kernel's parent-death signal must stop the server.
    proc = _cli_trial(tiny_model, tmp_path)
    _wait_for_replay(tmp_path, proc)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 30
    while vllm_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not vllm_processes()
