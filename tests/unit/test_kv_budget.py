"""The KV budget estimate against vLLM's own startup figures, and the model folders it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.common.errors import TunerError
from tuner.analysis.kv_budget import (ESTIMATE_ERROR, GiB, DeviceMemory, Fit, KvEstimate, estimate_kv, logged_kv_tokens,
                             read_model_memory)
from tuner.common.models import write_architecture
from tuner.workers.engine_config import EngineConfig

# One H200 as nvidia-smi reports it: 143,771 MiB.
H200 = DeviceMemory("cuda", 143771 * 2**20)

# vLLM 0.24.0 on an H200, bf16, as logged at startup ("GPU KV cache size: N tokens"): the table. Its
# first row is vLLM's default configuration, whose utilization is 0.92 (left unset here).
H200_TABLE = [
    ("llama-3.1-8b", EngineConfig(), 919_824),
    ("llama-3.1-8b", EngineConfig(gpu_memory_utilization=0.75, max_model_len=8192), 725_136),
    ("qwen2.5-32b", EngineConfig(gpu_memory_utilization=0.9), 262_960),
    ("qwen2.5-32b", EngineConfig(gpu_memory_utilization=0.95, kv_cache_dtype="fp8"), 553_008),
]


@pytest.fixture(scope="module")
def architectures(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("arch")
    return {name: read_model_memory(write_architecture(name, root / name)) for name in ("llama-3.1-8b", "qwen2.5-32b")}


def test_shipped_architectures_read_as_their_published_sizes(architectures):
    llama, qwen = architectures["llama-3.1-8b"], architectures["qwen2.5-32b"]
    assert llama.parameters == 8_030_261_248  # Meta's count for Llama-3.1-8B
    assert llama.kv_bytes_per_token() == 128 * 1024
    assert qwen.kv_bytes_per_token() == 256 * 1024 and qwen.kv_bytes_per_token(kv_cache_dtype="fp8") == 128 * 1024
    assert 32.7e9 < qwen.parameters < 32.8e9  # Qwen2.5-32B: 32.8B with its small attention biases


@pytest.mark.parametrize("name, config, measured", H200_TABLE, ids=[f"{r[0]}-{r[2]}" for r in H200_TABLE])
def test_estimate_is_within_its_stated_error_of_vllms_figure_on_an_h200(architectures, name, config, measured):
    estimate = estimate_kv(architectures[name], H200, config)
    assert estimate.basis == "gpu_memory_utilization" and estimate.error == ESTIMATE_ERROR
    assert abs(estimate.tokens - measured) <= ESTIMATE_ERROR * measured
    assert estimate.tokens % 16 == 0  # whole blocks of 16 tokens, as vLLM allocates on a GPU


# One H100 80GB as nvidia-smi reports it, and vLLM 0.24.0's KV cache there at its default utilization (issue 34,
# production engine, dummy weights): the checkpoint's bf16, online FP8 weights, and FP8 weights and KV cache.
H100 = DeviceMemory("cuda", 81559 * 2**20)
H100_PRECISION_TABLE = [
    ("llama-3.1-8b", EngineConfig(), 462_944),
    ("llama-3.1-8b", EngineConfig(quantization="fp8"), 515_600),
    ("llama-3.1-8b", EngineConfig(quantization="fp8", kv_cache_dtype="fp8"), 1_031_216),
    ("qwen2.5-32b", EngineConfig(quantization="fp8", kv_cache_dtype="fp8", max_model_len=32768), 298_256),
]


@pytest.mark.parametrize("name, config, measured", H100_PRECISION_TABLE,
                         ids=[f"{r[0]}-{r[2]}" for r in H100_PRECISION_TABLE])
def test_estimate_knows_the_weight_bytes_of_each_precision_on_an_h100(architectures, name, config, measured):
    assert abs(estimate_kv(architectures[name], H100, config).tokens - measured) <= ESTIMATE_ERROR * measured


def test_fp8_weights_quantize_the_linear_layers_and_keep_the_embeddings(architectures):
    llama = architectures["llama-3.1-8b"]
    embeddings = 2 * 128_256 * 4096  # input and output, untied
    assert llama.unquantized_parameters == embeddings + 32 * 2 * 4096 + 4096  # and the norms
    assert llama.weight_bytes(quantization="fp8") == (llama.parameters - llama.unquantized_parameters) \
        + 2 * llama.unquantized_parameters
    assert llama.quantization is None  # a bf16 checkpoint


def test_the_bf16_32b_at_32k_context_on_an_h100_fits_one_request_by_the_estimate(architectures):
    # 61 GiB of weights leave about 40k tokens at vLLM's default utilization: one request of 32k fits, so the rule
    # launches it (vLLM's own refusal, if it comes, is recorded as kv_insufficient beside the estimate).
    estimate = estimate_kv(architectures["qwen2.5-32b"], H100, EngineConfig(max_model_len=32768))
    assert 32_768 < estimate.tokens < 48_000 and estimate.fit(32_768) is Fit.FITS


def test_an_explicit_budget_is_exact_in_whole_blocks(tiny_model):
    tiny = read_model_memory(tiny_model)
    assert tiny.kv_bytes_per_token() == 4 * 2 * 2 * 64 * 2
    cpu = DeviceMemory("cpu", 16 * GiB)
    by_bytes = estimate_kv(tiny, cpu, EngineConfig(kv_cache_memory_bytes=5_000_000))
    assert (by_bytes.tokens, by_bytes.error, by_bytes.basis) == (19 * 128, 0.0, "kv_cache_memory_bytes")
    by_blocks = estimate_kv(tiny, cpu, EngineConfig(kv_cache_memory_bytes=5_000_000, num_gpu_blocks_override=40))
    assert (by_blocks.tokens, by_blocks.longest_context) == (40 * 128, 4096)  # capped at the model's positions


def test_weights_that_fill_the_card_leave_no_kv_cache(architectures):
    small_card = DeviceMemory.of("cuda", 40)
    estimate = estimate_kv(architectures["qwen2.5-32b"], small_card, EngineConfig())
    assert estimate.tokens == 0 and estimate.bytes < 0 and estimate.fit(1) is Fit.SHORT


@pytest.mark.parametrize("context, expected", [(950, Fit.FITS), (951, Fit.NEAR), (1000, Fit.NEAR),
                                               (1050, Fit.NEAR), (1051, Fit.SHORT)])
def test_a_context_fits_is_near_or_is_short_by_the_estimates_error(context, expected):
    assert KvEstimate(1000, 0, "gpu_memory_utilization", 0.05, 1000).fit(context) is expected


def test_the_kv_size_is_read_from_the_gpu_and_the_cpu_builds_logs():
    assert logged_kv_tokens("x [kv_cache_utils.py:2146] GPU KV cache size: 921,696 tokens\n") == 921_696
    cpu = "[kv_cache_utils.py:2327] CPU KV cache size: 2,432 tokens, Maximum concurrency for 1,024 tokens per request"
    assert logged_kv_tokens(cpu) == 2432
    assert logged_kv_tokens("no such line") is None


def _folder(tmp_path: Path, config: str | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    return folder


@pytest.mark.parametrize("config, expected", [
    (None, "not a model folder (no config.json)"),
    ("{nope", "config.json: not a usable model config (OSError"),
    (json.dumps({"hidden_size": 8}), "config.json: not a usable model config (ValueError: Unrecognized model"),
    (json.dumps({"model_type": "no-such-arch"}), "unknown architecture 'no-such-arch' (not known to transformers)"),
    (json.dumps({"model_type": "llama", "num_attention_heads": 0}), "not a usable model config (ZeroDivisionError"),
])
def test_a_folder_without_a_usable_config_is_one_line_naming_the_cause(tmp_path, config, expected):
    with pytest.raises(TunerError) as caught:
        read_model_memory(_folder(tmp_path, config))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_checkpoint_quantized_already_reads_as_its_own_method(tmp_path):
    folder = write_architecture("llama-3.1-8b", tmp_path / "awq")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "awq",
                                                                                         "bits": 4}}))
    model = read_model_memory(folder)
    assert model.quantization == "awq"
    # Its linear layers at 4 bits, its embeddings and norms at bf16; an online fp8 asked of it would not apply
    # (vLLM keeps the checkpoint's own), so the study never proposes one (tests/unit/test_derive.py).
    kept = model.unquantized_parameters
    assert model.weight_bytes() == (model.parameters - kept) // 2 + 2 * kept
