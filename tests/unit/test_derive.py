"""Search spaces derived from the model, the device and the trace (`--space auto`, `tuner space suggest`)."""

from __future__ import annotations

from dataclasses import replace

import json
import subprocess
import sys

import optuna
import pytest

from conftest import AZURE_CONV, run_tuner
from tuner.search_spaces import PREDICTED_KV_INSUFFICIENT, SpaceContext
from tuner.search_spaces.derive import derive_space
from test_kv_budget import H200, H200_TABLE
from tuner.storage import Repository
from tuner.common.errors import TunerError
from tuner.common.hardware import detect_hardware
from tuner.analysis.kv_budget import ESTIMATE_ERROR, DeviceMemory, estimate_kv, read_model_memory
from tuner.common.models import write_architecture
from tuner.common.paths import bundled_trace
from tuner.traces.selection import TraceSelection, load_trace
from tuner.traces.stats import percentile
from tuner.workers.engine_config import EngineConfig

TRACE = load_trace(bundled_trace(), TraceSelection())


@pytest.fixture(scope="module")
def architectures(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("arch")
    return {name: write_architecture(name, root / name) for name in ("llama-3.1-8b", "qwen2.5-32b")}


def _ranges(derived) -> dict:
    return {r.setting: r for r in derived.ranges}


@pytest.mark.parametrize("name, low", [("llama-3.1-8b", 0.15), ("qwen2.5-32b", 0.5)])
def test_shipped_architectures_get_sensible_ranges_for_an_h200(architectures, name, low):
    model = read_model_memory(architectures[name])
    derived = derive_space(model, H200, TRACE, "clip", fp8=True)
    space = derived.space
    utilization = space.parameters["gpu_memory_utilization"]
    # The least utilization whose cache holds the shortest context: just above the weights' share of the card.
    assert (utilization.low, utilization.high) == (low, 0.95)
    assert model.weight_bytes() / H200.total_bytes < low
    # The table's figures at the same settings lie within the stated error of the estimate the ranges come from.
    for table_name, config, measured in H200_TABLE:
        if table_name == name:
            assert abs(estimate_kv(model, H200, config).tokens - measured) <= ESTIMATE_ERROR * measured
    contexts = [r.input_tokens + r.output_tokens for r in TRACE.requests]
    choices = space.parameters["max_model_len"].choices
    assert choices == tuple(sorted(choices)) and choices[-1] >= max(contexts)
    assert "0% clipped" in _ranges(derived)["max_model_len"].reason
    seqs = space.parameters["max_num_seqs"]
    mean = sum(contexts) / len(contexts)
    # FP8 allowed: the largest budget offered is that of FP8 weights and KV cache, and the batch sizes only they
    # make room for are offered too.
    top = estimate_kv(model, H200, EngineConfig(gpu_memory_utilization=0.95, kv_cache_dtype="fp8", quantization="fp8"))
    assert seqs.choices[-1] == min(1000, int(top.tokens / mean))
    assert (f"({top.tokens:,} with weights and KV cache in FP8)"
            in _ranges(derived)["gpu_memory_utilization"].reason)
    assert 1 <= seqs.choices[0] < seqs.choices[-1]
    assert space.parameters["kv_cache_dtype"].choices == ("auto", "fp8")
    assert space.parameters["quantization"].choices == (None, "fp8")
    assert space.numerics_settings() == ["kv_cache_dtype", "quantization"]
    assert "enable_prefix_caching" not in space.parameters  # the Azure trace has no prefix blocks
    assert space.fixed == {"enable_chunked_prefill": True}
    # Every reason is one line, and the stored text carries it.
    assert all(r.reason and "\n" not in r.reason and r.reason in space.text for r in derived.ranges)


@pytest.mark.parametrize("setting", ["max_num_seqs", "max_num_batched_tokens"])
def test_settings_that_key_the_compile_cache_are_a_short_grid_spanning_the_derived_range(architectures, setting):
    derived = derive_space(read_model_memory(architectures["llama-3.1-8b"]), H200, TRACE, "clip")
    choices = derived.space.parameters[setting].choices
    prompts = [r.input_tokens for r in TRACE.requests]
    if setting == "max_num_batched_tokens":
        # The reasoning's ends: the median prompt in one step, four p99 prompts in one step (rounded up to 256).
        assert choices[0] == -(-percentile(prompts, 50) // 256) * 256
        assert choices[-1] == -(-4 * percentile(prompts, 99) // 256) * 256
    # Each value compiles once a study: a handful of them, ascending, the ones between powers of two.
    assert 2 <= len(choices) <= 4 and list(choices) == sorted(set(choices))
    assert all(v & (v - 1) == 0 for v in choices[1:-1])
    assert "keys vLLM's compile cache" in _ranges(derived)[setting].reason


def test_without_fp8_allowed_the_derived_space_keeps_the_checkpoints_numerics(architectures):
    model = read_model_memory(architectures["llama-3.1-8b"])
    derived = derive_space(model, H200, TRACE, "clip")
    assert "kv_cache_dtype" not in derived.space.parameters and "quantization" not in derived.space.parameters
    assert derived.space.numerics_settings() == []
    # The largest budget is the model's own precision's.
    top = estimate_kv(model, H200, EngineConfig(gpu_memory_utilization=0.95))
    mean = sum(r.input_tokens + r.output_tokens for r in TRACE.requests) / len(TRACE.requests)
    assert derived.space.parameters["max_num_seqs"].choices[-1] == min(1000, int(top.tokens / mean))
    assert _ranges(derived)["quantization"].values == "not searched"


def test_a_checkpoint_quantized_already_keeps_its_own_method(architectures):
    model = replace(read_model_memory(architectures["llama-3.1-8b"]), quantization="awq")
    derived = derive_space(model, H200, TRACE, "clip", fp8=True)
    assert derived.space.parameters["kv_cache_dtype"].choices == ("auto", "fp8")
    assert "quantization" not in derived.space.parameters
    assert "quantized already (awq)" in _ranges(derived)["quantization"].reason
    # Its weights are the method's: int4 for the linear layers, the embeddings at bf16.
    kept = model.unquantized_parameters
    assert model.weight_bytes() == (model.parameters - kept) // 2 + 2 * kept


def test_an_unfitted_trace_offers_only_contexts_that_hold_every_request(architectures):
    derived = derive_space(read_model_memory(architectures["llama-3.1-8b"]), H200, TRACE, None)
    longest = max(r.input_tokens + r.output_tokens for r in TRACE.requests)
    assert all(c >= longest for c in derived.space.parameters["max_model_len"].choices)


def test_prefix_caching_is_offered_when_the_trace_repeats_prefix_blocks(architectures):
    trace = load_trace(AZURE_CONV.parent / "mooncake_conversation_trace.jsonl", TraceSelection(max_requests=50))
    derived = derive_space(read_model_memory(architectures["llama-3.1-8b"]), H200, trace, "clip")
    assert derived.space.parameters["enable_prefix_caching"].choices == (True, False)
    assert "repeat an earlier one" in _ranges(derived)["enable_prefix_caching"].reason


def test_tiny_model_on_cpu_gets_a_budget_whose_low_end_is_refused_before_launch(tiny_model):
    trace = load_trace(bundled_trace(), TraceSelection(max_requests=16, rate_scale=100.0, fit="clip"))
    model = read_model_memory(tiny_model)
    device = DeviceMemory.of("cpu", 16)
    space = derive_space(model, device, trace, "clip").space
    assert space.fixed["enforce_eager"] is True and "kv_cache_dtype" not in space.parameters
    context = SpaceContext("cpu", max(r.input_tokens + r.output_tokens for r in trace.requests), "clip", 4096,
                           model, device)
    assert space.violations(space.baseline(), context) == []
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    reasons = [r for _ in range(40) for r in space.violations(space.suggest(study.ask()), context)]
    # Few blocks with a long context cannot hold one request: those proposals cost no launch.
    assert any(r.startswith(PREDICTED_KV_INSUFFICIENT) for r in reasons)


def test_space_suggest_prints_every_range_with_its_reason_and_writes_the_space(architectures, tmp_path):
    out = tmp_path / "auto.yaml"
    result = run_tuner("space", "suggest", "--model", str(architectures["qwen2.5-32b"]), "--gpu-memory", "140.4",
                       "--fit", "clip", "--max-requests", "200", "--out", str(out), "--json")
    printed = json.loads(result.stdout)
    assert printed["text"] == out.read_text()
    settings = [r["setting"] for r in printed["ranges"]]
    for setting in ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
                    "kv_cache_dtype", "enable_prefix_caching"):
        assert setting in settings and f"# {setting}: " in printed["text"]


@pytest.mark.parametrize("args, expected", [
    (["--model", "{empty}"], "not a model folder (no config.json)"),
    (["--model", "{unknown}"], "unknown architecture 'no-such-arch' (not known to transformers)"),
    (["--model", "{qwen}", "--gpu-memory", "40"], "the GPU's 40.0 GiB cannot hold the model's weights (61.0 GiB)"),
    (["--model", "{qwen}", "--gpu-memory", "0"], "--gpu-memory must be above 0 GiB"),
])
def test_bad_input_is_one_line_naming_the_cause_and_exit_2(architectures, tmp_path, args, expected):
    (tmp_path / "empty").mkdir()
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({"model_type": "no-such-arch"}))
    paths = {"empty": tmp_path / "empty", "unknown": tmp_path / "unknown", "qwen": architectures["qwen2.5-32b"]}
    argv = [a.format(**paths) for a in args]
    result = subprocess.run([sys.executable, "-m", "tuner", "space", "suggest", *argv], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and expected in result.stderr and result.stderr.count("\n") == 1


def test_a_gpu_that_holds_the_weights_but_not_one_request_is_refused(architectures):
    with pytest.raises(TunerError, match="short of one request of"):
        derive_space(read_model_memory(architectures["qwen2.5-32b"]), DeviceMemory.of("cuda", 67), TRACE, "clip")


def test_study_create_with_space_auto_stores_the_derived_text_and_the_models_sizes(tiny_model, tmp_path):
    storage = f"sqlite:///{tmp_path / 'tuner.db'}"
    selection = ["--max-requests", "16", "--rate-scale", "100", "--fit", "clip"]
    run_tuner("study", "create", "auto", "--model", str(tiny_model), "--space", "auto", *selection,
              "--storage", storage, "--artifacts", str(tmp_path / "artifacts"))
    settings = Repository(storage).get_study("auto")
    trace = load_trace(bundled_trace(), TraceSelection(max_requests=16, rate_scale=100.0, fit="clip"))
    model = read_model_memory(tiny_model)
    derived = derive_space(model, DeviceMemory.of_machine(detect_hardware()), trace, "clip")
    assert (settings.space_name, settings.space_text) == ("auto", derived.space.text)
    # A run judges proposals on the sizes stored at creation, without reading the folder again.
    assert settings.model_info.memory == model
