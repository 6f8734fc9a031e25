"""Engine settings: parsed from the command line, turned into vLLM flags, refused with a clear reason."""

from __future__ import annotations

import pytest

from tuner.common.errors import TunerError
from tuner.workers.engine_config import EngineConfig
from tuner.workers import launch
from tuner.workers.launch import (PER_REQUEST_METRICS_FLAG, declares_per_request_metrics, engine_argv,
                                  per_request_metrics_supported)


def test_assignments_become_typed_fields_and_flags():
    config = EngineConfig.from_assignments(["max_num_seqs=8", "gpu-memory-utilization=0.5", "enforce_eager=true",
                                            "enable_prefix_caching=off", "dtype=bfloat16"])
    assert config == EngineConfig(max_num_seqs=8, gpu_memory_utilization=0.5, enforce_eager=True,
                                  enable_prefix_caching=False, dtype="bfloat16")
    assert config.cli_args() == ["--max-num-seqs", "8", "--gpu-memory-utilization", "0.5", "--dtype", "bfloat16",
                                 "--no-enable-prefix-caching", "--enforce-eager"]
    assert config.to_dict() == {"max_num_seqs": 8, "gpu_memory_utilization": 0.5, "dtype": "bfloat16",
                                "enable_prefix_caching": False, "enforce_eager": True}


def test_fp8_weights_and_kv_cache_are_flags_that_change_numerics():
    config = EngineConfig.from_assignments(["quantization=fp8", "kv_cache_dtype=fp8"])
    assert config.cli_args() == ["--kv-cache-dtype", "fp8", "--quantization", "fp8"]
    assert config.changes_numerics and config.numerics_text() == "weights and KV cache in FP8"
    assert EngineConfig(kv_cache_dtype="fp8_e4m3").numerics_text() == "KV cache in FP8"
    assert EngineConfig(quantization="fp8").numerics_text() == "weights in FP8"
    for same in (EngineConfig(), EngineConfig(kv_cache_dtype="auto"), EngineConfig(dtype="bfloat16")):
        assert not same.changes_numerics and same.numerics_text() is None


def test_serve_command_quotes_what_a_shell_would_split():
    config = EngineConfig(max_num_seqs=4)
    assert config.serve_command("/models/my model") == "vllm serve '/models/my model' --max-num-seqs 4"


@pytest.mark.parametrize("items, message", [
    (["max_num_seqs"], "expected NAME=VALUE"),
    (["warp_speed=9"], "unknown engine setting 'warp_speed'"),
    (["max_num_seqs=eight"], "max_num_seqs expects int"),
    (["max_num_seqs=2.5"], "max_num_seqs expects int"),
    (["max_num_seqs=0"], "max_num_seqs must be at least 1"),
    (["max_num_seqs=2147483648"], "max_num_seqs must be at most 2147483647, got 2147483648"),
    (["max_model_len=" + "9" * 300], "max_model_len must be at most 2147483647, got 1e+300"),
    (["max_model_len=" + "9" * 400], "max_model_len must be at most 2147483647, got a number of 400 digits"),
    (["kv_cache_memory_bytes=" + "1" + "0" * 18], "kv_cache_memory_bytes must be at most 9007199254740992"),
    (["gpu_memory_utilization=1.5"], "gpu_memory_utilization must be in (0, 1]"),
    (["enforce_eager=maybe"], "enforce_eager expects bool"),
    (["dtype=int4"], "dtype must be one of"),
    (["kv_cache_dtype=fp3"], "kv_cache_dtype must be one of"),
    (["dtype=bfloat16; rm -rf /"], "dtype must be one of"),
])
def test_bad_settings_are_refused_with_the_reason(items, message):
    with pytest.raises(TunerError, match=None) as caught:
        EngineConfig.from_assignments(items)
    assert message in str(caught.value)


def test_argv_is_a_list_with_dummy_weights_for_a_config_only_model(tmp_path):
    from tuner.common.models import write_architecture

    folder = write_architecture("llama-3.1-8b", tmp_path / "llama")
    argv = engine_argv(folder, EngineConfig(max_model_len=4096), 8000, ["--seed", "1"])
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert ["--load-format", "dummy"] == argv[argv.index("--load-format"):argv.index("--load-format") + 2]
    assert "--skip-tokenizer-init" in argv
    assert argv[-2:] == ["--seed", "1"] and ["--max-model-len", "4096"] == argv[argv.index("--max-model-len"):][:2]


def test_argv_for_a_model_with_weights_loads_them(tiny_model):
    argv = engine_argv(tiny_model, EngineConfig(), 8000)
    assert "--load-format" not in argv and "--skip-tokenizer-init" not in argv


def test_the_installed_vllm_offers_per_request_metrics_and_the_server_is_asked_for_them(tiny_model):
    # The CPU build's 0.32 declares the flag; read from its source, vLLM itself is not imported.
    assert per_request_metrics_supported()
    argv = engine_argv(tiny_model, EngineConfig(), 8000, ["--seed", "1"])
    assert argv.count(PER_REQUEST_METRICS_FLAG) == 1 and argv[-2:] == ["--seed", "1"]


@pytest.mark.parametrize("extra", [
    ["--enable-per-request-metrics"], ["--enable_per_request_metrics"], ["--no-enable-per-request-metrics"],
    ["--disable-log-stats"],  # vLLM refuses per-request metrics beside it
    ["--disable-log-stats=true"],
])
def test_the_users_own_arguments_settle_per_request_metrics(tiny_model, extra):
    argv = engine_argv(tiny_model, EngineConfig(), 8000, extra)
    assert argv[-len(extra):] == extra and argv.count(PER_REQUEST_METRICS_FLAG) == extra.count(PER_REQUEST_METRICS_FLAG)


def test_a_vllm_without_per_request_metrics_is_not_given_the_flag(tiny_model, monkeypatch):
    monkeypatch.setattr(launch, "per_request_metrics_supported", lambda: False)
    assert PER_REQUEST_METRICS_FLAG not in engine_argv(tiny_model, EngineConfig(), 8000)


def test_support_is_read_from_the_servers_argument_definitions(tmp_path):
    old, new = tmp_path / "old" / "vllm", tmp_path / "new" / "vllm"
    (old / "entrypoints" / "openai").mkdir(parents=True)
    (old / "entrypoints" / "openai" / "cli_args.py").write_text("class FrontendArgs:\n    max_log_len: int = 0\n")
    (new / "entrypoints" / "launchers").mkdir(parents=True)
    (new / "entrypoints" / "launchers" / "cli_args.py").write_text(
        "class FrontendArgs:\n    enable_per_request_metrics: bool = False\n")
    assert not declares_per_request_metrics([old])
    assert declares_per_request_metrics([new]) and declares_per_request_metrics([old, new])
    assert not declares_per_request_metrics([tmp_path / "absent"])
