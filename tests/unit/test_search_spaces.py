"""Search space files: loading, validation errors, Optuna suggestions, and the rules that reject a proposal."""

from __future__ import annotations

from dataclasses import replace

import json
import math
from pathlib import Path

import jsonschema
import optuna
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from conftest import AZURE_CONV
from tuner.search_spaces import (PLATFORMS, PREDICTED_KV_INSUFFICIENT, SpaceContext, SpaceFile, load_space,
                                 parse_comparison, shipped_spaces)
from tuner.common.errors import TunerError
from tuner.analysis.kv_budget import DeviceMemory, ModelMemory
from tuner.common.models import ModelInfo
from tuner.search_spaces.parameters import FloatParameter
from tuner.traces.records import Trace, TraceRequest
from tuner.traces.selection import TraceSelection, load_trace
from tuner.workers.engine_config import EngineConfig

SHIPPED = ["cpu-small", "default", "h200-llama8b"]
CPU = SpaceContext("cpu", longest_request_tokens=1024, fit=None, model_max_len=4096)
CUDA = SpaceContext("cuda", longest_request_tokens=1024, fit=None, model_max_len=4096)
# Llama-3.1-8B (131072 positions) replaying a trace whose longest request is 8192 tokens.
LLAMA8B_ON_H200 = SpaceContext("cuda", longest_request_tokens=8192, fit=None, model_max_len=131072)
# The tests' tiny model replaying the Azure slice clipped to 1024 tokens.
TINY_ON_CPU = SpaceContext("cpu", longest_request_tokens=20000, fit="clip", model_max_len=4096)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def study() -> optuna.Study:
    return optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))


# ---- the shipped files ----

def test_the_three_shipped_spaces_are_found():
    assert shipped_spaces() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_space_loads_with_its_text_and_a_baseline_of_fixed_values_only(name):
    space = load_space(name)
    assert space.name == name and space.description.strip()
    assert space.path.name == f"{name}.yaml" and space.text == space.path.read_text()
    assert space.parameters and not set(space.parameters) & set(space.fixed)
    baseline = space.baseline()
    assert baseline.to_dict() == space.fixed
    assert all(getattr(baseline, p) is None for p in space.parameters)
    assert load_space(space.path) == space  # by path as by name


@pytest.mark.parametrize("name", SHIPPED)
def test_suggestions_from_a_real_study_lie_in_range_and_on_the_grid(name):
    space = load_space(name)
    s = study()
    for _ in range(40):
        trial = s.ask()
        config = space.suggest(trial)
        assert trial.distributions == space.distributions()
        assert set(trial.params) == set(space.parameters)
        for key, value in space.fixed.items():
            assert getattr(config, key) == value
        for key, dist in space.distributions().items():
            value = getattr(config, key)
            # A float on a step grid is rounded to the step's decimals (0.85, not 0.8500000000000001).
            assert value == pytest.approx(trial.params[key], abs=1e-9)
            if isinstance(dist, CategoricalDistribution):
                assert value in dist.choices
                continue
            assert dist.low <= value <= dist.high
            if isinstance(dist, IntDistribution):
                assert isinstance(value, int) and not isinstance(value, bool)
                assert (value - dist.low) % dist.step == 0
            elif dist.step is not None:
                steps = (value - dist.low) / dist.step
                assert math.isclose(steps, round(steps), abs_tol=1e-6)
        s.tell(trial, [1.0, 1.0])


def test_log_and_step_are_carried_to_optuna():
    dists = load_space("cpu-small").distributions()
    assert dists["max_num_seqs"] == IntDistribution(2, 16, log=True)
    assert dists["num_gpu_blocks_override"] == IntDistribution(12, 96, log=True)
    assert dists["max_num_batched_tokens"] == IntDistribution(256, 2048, step=256)
    assert load_space("default").distributions()["gpu_memory_utilization"] == FloatDistribution(0.5, 0.95, step=0.05)


def test_cpu_small_kv_budget_ranges_from_preemption_to_none_on_the_test_slice():
    space = load_space("cpu-small")
    assert space.fixed["max_model_len"] == 1024 and space.fixed["kv_cache_memory_bytes"] == 268435456
    blocks = space.parameters["num_gpu_blocks_override"]
    trace = load_trace(AZURE_CONV, TraceSelection(max_requests=16, rate_scale=100.0, fit="clip"), 1024)
    tokens = sum(r.input_tokens + r.output_tokens for r in trace.requests)
    block_tokens = 128
    # The smallest budget still holds one full-length request, but far less than the sixteen that arrive together.
    assert 1024 <= blocks.low * block_tokens < tokens / 4
    assert blocks.high * block_tokens >= tokens


@pytest.mark.parametrize("name, context", [("cpu-small", TINY_ON_CPU), ("h200-llama8b", LLAMA8B_ON_H200)])
def test_every_proposal_of_a_hardware_space_is_feasible_on_its_hardware(name, context):
    space = load_space(name)
    s = study()
    for _ in range(40):
        assert space.violations(space.suggest(s.ask()), context) == []


def test_default_space_proposes_unchunked_batches_that_the_rules_reject():
    space = load_space("default")
    s = study()
    context = SpaceContext("cuda", longest_request_tokens=1024, fit=None, model_max_len=16384)
    reasons = [r for _ in range(60) for r in space.violations(space.suggest(s.ask()), context)]
    assert any("with enable_chunked_prefill false" in r for r in reasons)


# ---- the published JSON Schema ----

SCHEMA = Path(__file__).resolve().parents[2] / "search_spaces" / "schema.json"


def test_the_published_schema_is_the_one_the_models_generate():
    assert json.loads(SCHEMA.read_text()) == SpaceFile.model_json_schema(), (
        "regenerate: python -c 'import json; from tuner.search_spaces import SpaceFile; "
        "print(json.dumps(SpaceFile.model_json_schema(), indent=2))' > search_spaces/schema.json")


@pytest.mark.parametrize("name", SHIPPED)
def test_the_schema_accepts_every_shipped_space_and_refuses_an_unknown_key(name):
    schema = json.loads(SCHEMA.read_text())
    document = yaml.safe_load(load_space(name).text)
    jsonschema.validate(document, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**document, "parameterz": {}}, schema)


# ---- validation errors: one line, naming the file and the key ----

VALID_PARAM = "parameters:\n  max_num_seqs: {type: int, low: 2, high: 8}\n"

BROKEN = [
    ("name: x\nparameterz: {}\n", "parameterz: unknown key; known: name, description"),
    ("name: [a]\n" + VALID_PARAM, "name: expected a string, got a list"),
    ("parameters:\n  max_num_seq: {type: int, low: 1, high: 2}\n", "parameters.max_num_seq: unknown engine setting"),
    ("fixed: {speed: 3}\n" + VALID_PARAM, "fixed.speed: unknown engine setting"),
    ("fixed: [a]\n" + VALID_PARAM, "fixed: expected a mapping, got a list"),
    ("fixed: {max_num_seqs: 4}\n" + VALID_PARAM, "parameters.max_num_seqs: is also fixed"),
    ("fixed: {dtype: fp16}\n" + VALID_PARAM, "fixed.dtype: dtype must be one of"),
    ("fixed: {max_model_len: -1}\n" + VALID_PARAM, "fixed.max_model_len: max_model_len must be at least 1"),
    ("fixed: {enforce_eager: maybe}\n" + VALID_PARAM, "fixed.enforce_eager: enforce_eager expects bool"),
    ("fixed: {enforce_eager: null}\n" + VALID_PARAM, "fixed.enforce_eager: expected a single value, got nothing"),
    ("parameters: [max_num_seqs]\n", "parameters: expected a mapping, got a list"),
    ("parameters:\n  max_num_seqs: 8\n", "parameters.max_num_seqs: expected a mapping, got 8"),
    ("parameters:\n  max_num_seqs: {type: integer, low: 1, high: 8}\n",
     "parameters.max_num_seqs.type: expected one of int, float, categorical, got 'integer'"),
    ("parameters:\n  max_num_seqs: {type: int, low: 1, high: 8, choices: [1]}\n",
     "parameters.max_num_seqs.choices: unknown key for type int"),
    ("parameters:\n  gpu_memory_utilization: {type: int, low: 1, high: 1}\n",
     "parameters.gpu_memory_utilization.type: gpu_memory_utilization is a float setting"),
    ("parameters:\n  enforce_eager: {type: int, low: 0, high: 1}\n", "parameters.enforce_eager.type: enforce_eager is a bool"),
    ("parameters:\n  max_num_seqs: {type: int, low: 1.5, high: 8}\n",
     "parameters.max_num_seqs.low: expected an integer, got 1.5"),
    ("parameters:\n  max_num_seqs: {type: int, low: '2', high: 8}\n",
     "parameters.max_num_seqs.low: expected an integer, got '2'"),
    ("parameters:\n  max_num_seqs: {type: int, low: 2}\n", "parameters.max_num_seqs.high: expected an integer, got nothing"),
    ("parameters:\n  gpu_memory_utilization: {type: float, low: 0.5, high: .inf}\n",
     "parameters.gpu_memory_utilization.high: expected a number, got inf"),
    ("parameters:\n  max_num_seqs: {type: int, low: 64, high: 8}\n", "parameters.max_num_seqs: low (64) is above high (8)"),
    ("parameters:\n  max_num_seqs: {type: int, low: 0, high: 8, log: true}\n",
     "parameters.max_num_seqs.low: a log scale needs low above 0, got 0"),
    ("parameters:\n  gpu_memory_utilization: {type: float, low: -0.5, high: 0.9, log: true}\n",
     "parameters.gpu_memory_utilization.low: a log scale needs low above 0"),
    ("parameters:\n  max_num_seqs: {type: int, low: 2, high: 8, step: 2, log: true}\n",
     "parameters.max_num_seqs.step: step and log cannot be combined"),
    ("parameters:\n  max_num_seqs: {type: int, low: 2, high: 8, log: 'yes'}\n",
     "parameters.max_num_seqs.log: expected true or false, got 'yes'"),
    ("parameters:\n  max_num_seqs: {type: int, low: 2, high: 8, step: 0}\n", "parameters.max_num_seqs.step: must be above 0"),
    ("parameters:\n  max_num_batched_tokens: {type: int, low: 256, high: 2000, step: 256}\n",
     "parameters.max_num_batched_tokens.high: high (2000) is not low (256) plus a whole number of steps (256)"),
    ("parameters:\n  max_num_seqs: {type: int, low: 0, high: 8}\n",
     "parameters.max_num_seqs.low: max_num_seqs must be at least 1, got 0"),
    ("parameters:\n  gpu_memory_utilization: {type: float, low: 0.5, high: 1.5}\n",
     "parameters.gpu_memory_utilization.high: gpu_memory_utilization must be in (0, 1], got 1.5"),
    ("parameters:\n  dtype: {type: categorical, choices: []}\n", "parameters.dtype.choices: expected a non-empty list"),
    ("parameters:\n  dtype: {type: categorical}\n", "parameters.dtype.choices: expected a non-empty list of values, got nothing"),
    ("parameters:\n  dtype: {type: categorical, choices: [auto, fp16]}\n",
     "parameters.dtype.choices[1]: dtype must be one of auto, half"),
    ("parameters:\n  max_num_seqs: {type: categorical, choices: [8, many]}\n",
     "parameters.max_num_seqs.choices[1]: max_num_seqs expects int, got 'many'"),
    ("parameters:\n  max_num_seqs: {type: categorical, choices: [8, [16]]}\n",
     "parameters.max_num_seqs.choices[1]: expected a single value, got a list"),
    ("parameters:\n  dtype: {type: categorical, choices: [auto, bfloat16, auto]}\n",
     "parameters.dtype.choices: 'auto' is listed twice"),
    (VALID_PARAM + "constraints: {require: max_num_seqs > 1}\n", "constraints: expected a list, got a mapping"),
    (VALID_PARAM + "constraints:\n  - max_num_seqs > 1\n", "constraints[0]: expected a mapping, got 'max_num_seqs > 1'"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seqs > 1, if: dtype == 'auto'}\n", "constraints[0].if: unknown key"),
    (VALID_PARAM + "constraints:\n  - {when: max_num_seqs > 1}\n", "constraints[0].require: missing"),
    (VALID_PARAM + "constraints:\n  - {require: true}\n", "constraints[0].require: expected a string, got True"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seqs >=}\n", "constraints[0].require: expected NAME OP VALUE"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seqs 8}\n", "constraints[0].require: expected NAME OP VALUE"),
    (VALID_PARAM + "constraints:\n  - {require: 1 < max_num_seqs < 8}\n", "constraints[0].require: expected NAME OP VALUE"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seqs => 8}\n", "constraints[0].require: unexpected '='"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seq >= 8}\n",
     "constraints[0].require: unknown engine setting 'max_num_seq'"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seqs >= 8, when: chunked == true}\n",
     "constraints[0].when: unknown engine setting 'chunked'"),
    (VALID_PARAM + "constraints:\n  - {require: dtype == bfloat16}\n",
     "constraints[0].require: unknown engine setting 'bfloat16' (quote a string literal: 'bfloat16')"),
    (VALID_PARAM + "constraints:\n  - {require: \"dtype == 'bf16'\"}\n", "constraints[0].require: dtype must be one of"),
    (VALID_PARAM + "constraints:\n  - {require: 1 < 2}\n", "constraints[0].require: '1 < 2' compares two literals"),
    (VALID_PARAM + "constraints:\n  - {require: enable_chunked_prefill == 1}\n", "compares a bool with a number"),
    (VALID_PARAM + "constraints:\n  - {require: enable_chunked_prefill < true}\n", "< compares numbers only, not a bool"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seqs != dtype}\n", "compares a number with a str"),
    (VALID_PARAM + "constraints:\n  - {require: \"__import__('os') == 1\"}\n", "constraints[0].require: unexpected '('"),
    (VALID_PARAM + "constraints:\n  - {require: __import__ == 1}\n",
     "constraints[0].require: unknown engine setting '__import__'"),
    (VALID_PARAM + "constraints:\n  - {require: max_num_seqs.__class__ == 1}\n", "constraints[0].require: unexpected '.'"),
]


@pytest.mark.parametrize("text, expected", BROKEN, ids=[b[1][:60] for b in BROKEN])
def test_a_broken_file_is_refused_with_one_line_naming_the_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(TunerError) as info:
        load_space(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


@pytest.mark.parametrize("text, expected", [
    ("parameters: {max_num_seqs: [1, 2}\n", "invalid YAML at line 1"),
    ("parameters:\n\tmax_num_seqs: 1\n", "invalid YAML at line 2"),
    ("- a\n- b\n", "expected a mapping, got a list"),
    ("", "expected a mapping, got nothing"),
])
def test_a_file_that_is_not_a_yaml_mapping_is_refused_naming_the_file(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(TunerError) as info:
        load_space(path)
    assert str(info.value).startswith(f"{path}: {expected}") and "\n" not in str(info.value)


def test_a_missing_file_or_unknown_name_is_refused_listing_the_shipped_spaces(tmp_path):
    with pytest.raises(TunerError, match=r"nope\.yaml: no such search space file \(shipped: cpu-small, default"):
        load_space(tmp_path / "nope.yaml")
    with pytest.raises(TunerError, match=r"^h100: no such search space file"):
        load_space("h100")


def test_parsing_never_runs_code(tmp_path):
    marker = tmp_path / "ran"
    for text in (f"__import__('os').system('touch {marker}') == 1", f"max_num_seqs == open('{marker}', 'w')",
                 "max_num_seqs == (lambda: 1)()"):
        with pytest.raises(TunerError):
            parse_comparison(text)
    assert not marker.exists()


def test_a_minimal_file_defaults_its_name_to_the_file_stem(tmp_path):
    space = load_space(write(tmp_path, VALID_PARAM))
    assert (space.name, space.description, space.fixed, space.constraints) == ("space", "", {}, ())


# ---- expressions ----

@pytest.mark.parametrize("text, values, expected", [
    ("max_num_seqs<=64", {"max_num_seqs": 64}, True),
    ("64 < max_num_seqs", {"max_num_seqs": 64}, False),
    ("gpu_memory_utilization >= 0.9", {"gpu_memory_utilization": 0.95}, True),
    ("gpu_memory_utilization > 9e-1", {"gpu_memory_utilization": 0.9}, False),
    ("max_num_seqs > -1", {"max_num_seqs": 1}, True),
    ("enable_chunked_prefill == False", {"enable_chunked_prefill": False}, True),
    ("dtype != \"float32\"", {"dtype": "float32"}, False),
    ("kv_cache_dtype == 'fp8'", {"kv_cache_dtype": "fp8"}, True),
    ("max_num_batched_tokens >= max_model_len", {"max_num_batched_tokens": 512, "max_model_len": 1024}, False),
    ("max_num_batched_tokens >= max_model_len", {"max_num_batched_tokens": 512}, None),
])
def test_a_comparison_evaluates_on_the_set_fields_and_is_none_when_one_is_unset(text, values, expected):
    assert parse_comparison(text).evaluate(values) is expected


def test_a_comparison_keeps_a_normalized_text():
    assert parse_comparison("  max_num_seqs<=  64 ").text == "max_num_seqs <= 64"


# ---- built-in rules ----

EMPTY = "parameters: {}\n"

RULES = [
    (EngineConfig(max_num_seqs=64, max_num_batched_tokens=32), CUDA,
     "max_num_batched_tokens (32) is below max_num_seqs (64)"),
    (EngineConfig(max_model_len=1000), CUDA,
     "max_model_len (1000) is below the trace's longest request (1024 tokens)"),
    (EngineConfig(), SpaceContext("cuda", longest_request_tokens=5000, fit=None, model_max_len=4096),
     "max_model_len (unset: the model's 4096) is below the trace's longest request (5000 tokens)"),
    (EngineConfig(max_model_len=8192), CUDA, "max_model_len (8192) is above the model's max_position_embeddings (4096)"),
    (EngineConfig(dtype="float16"), CPU, "dtype float16 is not available on cpu (supported: auto, bfloat16, float, float32)"),
    (EngineConfig(dtype="half"), CPU, "dtype half is not available on cpu"),
    (EngineConfig(kv_cache_dtype="fp8_e5m2"), CPU,
     "KV cache in FP8: the study does not allow FP8 (it changes the model's numerics: create it with --allow-fp8)"),
    (EngineConfig(quantization="fp8", kv_cache_dtype="fp8"), replace(CUDA, fp8_refused="FP8 needs a GPU of compute "
                                                                     "capability 8.9 or later"),
     "weights and KV cache in FP8: FP8 needs a GPU of compute capability 8.9 or later"),
    (EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=2048), CUDA,
     "max_num_batched_tokens (512) is below max_model_len (2048) with enable_chunked_prefill false"),
    (EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048), CUDA,
     "max_num_batched_tokens (2048) is below max_model_len (unset: the model's 4096) with enable_chunked_prefill false"),
]


@pytest.mark.parametrize("config, context, expected", RULES, ids=[r[2][:50] for r in RULES])
def test_each_built_in_rule_rejects_with_a_clear_reason(tmp_path, config, context, expected):
    reasons = load_space(write(tmp_path, EMPTY)).violations(config, context)
    assert len(reasons) == 1 and reasons[0].startswith(expected)


@pytest.mark.parametrize("config, context", [
    (EngineConfig(max_num_seqs=64, max_num_batched_tokens=64, max_model_len=1024), CUDA),
    (EngineConfig(max_num_seqs=64), CUDA),  # vLLM's default batch is large enough
    (EngineConfig(max_model_len=512), SpaceContext("cuda", 1024, "clip", 4096)),
    (EngineConfig(max_model_len=512), SpaceContext("cpu", 1024, "scale", 4096)),
    (EngineConfig(dtype="float16", kv_cache_dtype="fp8_e4m3", quantization="fp8"), replace(CUDA, fp8_refused=None)),
    (EngineConfig(dtype="bfloat16", kv_cache_dtype="bfloat16"), CPU),
    (EngineConfig(enable_chunked_prefill=True, max_num_batched_tokens=256, max_model_len=2048), CPU),
    (EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048, max_model_len=2048), CPU),
])
def test_a_feasible_configuration_has_no_violations(tmp_path, config, context):
    assert load_space(write(tmp_path, EMPTY)).violations(config, context) == []


def test_platform_dtypes_are_engine_dtypes_and_every_one_passes_its_platform(tmp_path):
    space = load_space(write(tmp_path, EMPTY))
    for platform, support in PLATFORMS.items():
        context = SpaceContext(platform, 1024, None, 4096)
        for dtype in support.dtypes:
            assert space.violations(EngineConfig(dtype=dtype), context) == []
    assert "float16" not in PLATFORMS["cpu"].dtypes and "float16" in PLATFORMS["cuda"].dtypes


def test_every_broken_rule_is_reported_at_once(tmp_path):
    config = EngineConfig(max_num_seqs=64, max_num_batched_tokens=32, dtype="float16", max_model_len=8192)
    reasons = load_space(write(tmp_path, EMPTY)).violations(config, CPU)
    assert len(reasons) == 3
    assert any("max_num_seqs" in r for r in reasons) and any("float16" in r for r in reasons)
    assert any("max_position_embeddings" in r for r in reasons)


# ---- the estimated KV cache must hold one request ----

# The tests' tiny model (2048 bytes of KV per token, blocks of 128 tokens on CPU) and Llama-3.1-8B on an H200.
TINY = ModelMemory("LlamaForCausalLM", 4, 2, 64, 256, 512, 2_623_744, "bfloat16", 4096)
LLAMA8B = ModelMemory("LlamaForCausalLM", 32, 8, 128, 4096, 14336, 8_030_261_248, "bfloat16", 131072)
TINY_KV = SpaceContext("cpu", 1024, "clip", 4096, TINY, DeviceMemory.of("cpu", 16))
LLAMA8B_KV = SpaceContext("cuda", 1024, "clip", 131072, LLAMA8B, DeviceMemory("cuda", 143771 * 2**20))


@pytest.mark.parametrize("config, context, expected", [
    # 1 MiB holds 4 blocks of 128 tokens: 512, half of one request.
    (EngineConfig(kv_cache_memory_bytes=2**20, max_model_len=1024), TINY_KV,
     "the KV cache is estimated at 512 tokens from kv_cache_memory_bytes, below one request of max_model_len (1024)"),
    (EngineConfig(kv_cache_memory_bytes=2**24, num_gpu_blocks_override=7, max_model_len=1024), TINY_KV,
     "the KV cache is estimated at 896 tokens from num_gpu_blocks_override"),
    # 0.15 of an H200 leaves about 40,000 tokens beside the weights: the model's 131,072 cannot fit.
    (EngineConfig(gpu_memory_utilization=0.15), LLAMA8B_KV,
     "the KV cache is estimated at 39,328 tokens (+/-5%) from gpu_memory_utilization, below one request of "
     "max_model_len (unset: the model's 131072)"),
    (EngineConfig(gpu_memory_utilization=0.1, max_model_len=1024), LLAMA8B_KV,
     "the weights (15.0 GiB) and the engine's overheads leave no KV cache at gpu_memory_utilization 0.1"),
])
def test_a_kv_cache_estimated_short_of_one_request_is_refused_as_predicted(tmp_path, config, context, expected):
    reasons = load_space(write(tmp_path, EMPTY)).violations(config, context)
    assert len(reasons) == 1 and reasons[0].startswith(f"{PREDICTED_KV_INSUFFICIENT}: {expected}")


@pytest.mark.parametrize("config, context", [
    (EngineConfig(kv_cache_memory_bytes=2**19 + 2**18, max_model_len=384), TINY_KV),  # exactly 3 blocks
    (EngineConfig(num_gpu_blocks_override=8, max_model_len=1024), TINY_KV),
    (EngineConfig(gpu_memory_utilization=0.15, max_model_len=32768), LLAMA8B_KV),
    # Near the margin (39,328 tokens, +/-5%): launched, so that the real outcome tells.
    (EngineConfig(gpu_memory_utilization=0.15, max_model_len=41_000), LLAMA8B_KV),
    (EngineConfig(gpu_memory_utilization=0.15), CUDA),  # no model sizes in the context: not judged
])
def test_a_kv_cache_that_holds_one_request_or_may_is_launched(tmp_path, config, context):
    assert load_space(write(tmp_path, EMPTY)).violations(config, context) == []


# ---- file constraints ----

CONSTRAINED = VALID_PARAM + """constraints:
  - require: max_num_seqs <= 4
  - require: max_num_batched_tokens >= 4096
    when: max_model_len >= 8192
  - require: kv_cache_dtype != 'fp8'
    when: dtype == "float32"
"""
CONTEXT = SpaceContext("cuda", longest_request_tokens=10, fit=None, model_max_len=32768, fp8_refused=None)


@pytest.mark.parametrize("config, expected", [
    (EngineConfig(max_num_seqs=8), ["constraint max_num_seqs <= 4 fails: max_num_seqs=8"]),
    (EngineConfig(max_model_len=8192, max_num_batched_tokens=2048),
     ["constraint max_num_batched_tokens >= 4096 (when max_model_len >= 8192) fails: max_num_batched_tokens=2048"]),
    (EngineConfig(dtype="float32", kv_cache_dtype="fp8"),
     ["constraint kv_cache_dtype != 'fp8' (when dtype == \"float32\") fails: kv_cache_dtype=fp8"]),
    (EngineConfig(max_num_seqs=4, max_model_len=4096, max_num_batched_tokens=2048), []),  # `when` does not hold
    (EngineConfig(max_model_len=8192, max_num_batched_tokens=8192), []),
    (EngineConfig(max_model_len=8192), []),  # max_num_batched_tokens unset: the constraint does not apply
    (EngineConfig(max_num_batched_tokens=2048), []),  # max_model_len unset: its `when` does not apply
    (EngineConfig(dtype="bfloat16", kv_cache_dtype="fp8"), []),
])
def test_file_constraints_apply_with_and_without_when(tmp_path, config, expected):
    assert load_space(write(tmp_path, CONSTRAINED)).violations(config, CONTEXT) == expected


def test_a_field_to_field_constraint_reports_both_values(tmp_path):
    space = load_space(write(tmp_path, VALID_PARAM + "constraints:\n  - require: max_num_batched_tokens > max_num_seqs\n"))
    assert space.violations(EngineConfig(max_num_seqs=8, max_num_batched_tokens=8), CONTEXT) == [
        "constraint max_num_batched_tokens > max_num_seqs fails: max_num_batched_tokens=8, max_num_seqs=8"]


# ---- the context ----

def test_context_for_a_run_takes_the_longest_request_of_the_trace_and_the_model_positions():
    trace = Trace("t.csv", "native", "0" * 64, (TraceRequest(0.0, 100, 20), TraceRequest(1.0, 700, 300)))
    model = ModelInfo(Path("m"), "LlamaForCausalLM", 1024, 4096, True, True, 2048)
    assert SpaceContext.for_run("cpu", model, trace, "clip") == SpaceContext("cpu", 1000, "clip", 4096)


@pytest.mark.parametrize("args, expected", [
    (("tpu", 1, None, 1), "platform must be one of cuda, cpu"),
    (("cpu", 1, "crop", 1), "fit must be one of clip, scale"),
    (("cpu", -1, None, 1), "longest_request_tokens must be at least 0"),
    (("cpu", 1, None, 0), "model_max_len must be at least 1"),
])
def test_a_bad_context_is_refused(args, expected):
    with pytest.raises(TunerError, match=expected.replace("(", r"\(")):
        SpaceContext(*args)


# ---- any configuration a space can propose is judged without an exception ----

def _values(dist) -> st.SearchStrategy:
    if isinstance(dist, CategoricalDistribution):
        return st.sampled_from(dist.choices)
    if dist.step is not None and not dist.log:
        count = round((dist.high - dist.low) / dist.step)
        return st.integers(0, count).map(lambda k: type(dist.low)(dist.low + k * dist.step))
    if isinstance(dist, IntDistribution):
        return st.integers(dist.low, dist.high)
    return st.floats(dist.low, dist.high)


CONTEXTS = st.builds(SpaceContext, st.sampled_from(list(PLATFORMS)), st.integers(0, 200_000),
                     st.sampled_from([None, "clip", "scale"]), st.integers(1, 200_000))


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=150, deadline=None)
@given(data=st.data(), context=CONTEXTS)
def test_any_proposal_gives_reasons_or_none_never_an_exception(name, data, context):
    space = load_space(name)
    drawn = {key: data.draw(_values(dist), label=key) for key, dist in space.distributions().items()}
    reasons = space.violations(EngineConfig(**space.fixed, **drawn), context)
    assert isinstance(reasons, list)
    assert all(isinstance(r, str) and r.strip() and "\n" not in r for r in reasons)


def test_float_steps_read_as_written():
    """Optuna's step grid is binary floating point; the configuration, and so `vllm serve`, is not."""
    s = study()
    utilization = FloatParameter(type="float", low=0.15, high=0.95, step=0.05)
    values = {utilization.suggest(s.ask(), "gpu_memory_utilization") for _ in range(60)}
    assert values <= {round(0.15 + 0.05 * k, 2) for k in range(17)} and len(values) > 5
