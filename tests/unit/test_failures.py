"""Failure classes from exit status and log. The real-vLLM tests (test_trial_vllm, test_launch_vllm) show
each on a real server; these pin the rules on log lines copied from vLLM 0.32.0 on this machine."""

from __future__ import annotations

from tuner.workers.failures import FailureClass, classify_failure

KV_LOG = """\
(EngineCore pid=4269) ERROR 12-02 13:56:37 [core.py:1510]     raise ValueError(
(EngineCore pid=4269) ERROR 12-02 13:56:37 [core.py:1510] ValueError: To serve at least one request with the model's max seq len (4096), (0.01 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum model length is 768. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
MEMORY_LOG = """\
(EngineCore pid=5210) ERROR 12-02 13:58:42 [multiproc_executor.py:953] ValueError: Available memory on node 0 (6.28/7.59 GiB) on startup is less than desired CPU memory utilization (0.92, 6.98 GiB). Decrease memory utilization or reduce GPU memory used by other processes.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_kv_insufficient_carries_vllms_estimate():
    failure = classify_failure(1, KV_LOG)
    assert failure.kind is FailureClass.KV_INSUFFICIENT
    assert failure.estimated_max_model_len == 768
    assert "estimated maximum model length is 768" in failure.log_excerpt


def test_memory_refusal_is_load_oom_not_invalid_config():
    failure = classify_failure(1, MEMORY_LOG)
    assert failure.kind is FailureClass.LOAD_OOM and failure.estimated_max_model_len is None
    assert "less than desired CPU memory utilization" in failure.message


def test_argparse_error_is_invalid_config():
    log = "usage: api_server.py [-h] ...\napi_server.py: error: unrecognized arguments: --warp-speed\n"
    failure = classify_failure(2, log)
    assert failure.kind is FailureClass.INVALID_CONFIG and failure.exit_code == 2


def test_serving_engine_that_exits_is_engine_died_whatever_its_log_says():
    assert classify_failure(-9, KV_LOG, was_serving=True).kind is FailureClass.ENGINE_DIED


def test_timeout_and_unknown_crash():
    assert classify_failure(None, "loading...\n", timed_out=True).kind is FailureClass.STARTUP_TIMEOUT
    crash = classify_failure(-11, "INFO starting\nSegmentation fault\n")
    assert crash.kind is FailureClass.STARTUP_CRASH and "Segmentation fault" in crash.log_excerpt


def test_startup_killed_without_a_log_line_is_load_oom():
    # The out-of-memory killer sends SIGKILL and writes nothing into the engine's log.
    log = "INFO 12-02 13:58:40 [loader.py:12] Loading weights took 3.21 seconds\n"
    for code in (137, -9):
        failure = classify_failure(code, log)
        assert failure.kind is FailureClass.LOAD_OOM
        assert "SIGKILL" in failure.message and f"exit code {code}" in failure.message
    assert classify_failure(1, log).kind is FailureClass.STARTUP_CRASH
