"""How many tokens of KV cache vLLM will have, estimated before any launch.

From the model's config (read with transformers' AutoConfig, so nested text configs and other architectures
are read as vLLM reads them), the dtype and KV cache dtype, the device's memory and the engine settings. On the
CPU build an explicit `kv_cache_memory_bytes` or `num_gpu_blocks_override` decides the budget exactly; on a
GPU vLLM keeps `gpu_memory_utilization` of the card, less the weights, the activations of one batch and a
fixed overhead, calibrated against vLLM's own startup figures (BENCHMARKS.md, "KV budget estimate").
"""

from __future__ import annotations

import enum
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from tuner.common.errors import TunerError
from tuner.common.hardware import HardwareInfo
from tuner.workers.engine_config import EngineConfig

GiB = 2**30

# vLLM's own defaults where a setting is unset (vLLM 0.24 on an H100/H200-class GPU, 0.32 on CPU).
VLLM_DEFAULT_UTILIZATION = 0.92
BLOCK_TOKENS = {"cuda": 16, "cpu": 128}
DEFAULT_BATCHED_TOKENS = {"cuda": 8192, "cpu": 2048}

# Fitted by least squares on the 17 Llama-3.1-8B startups measured on an H200 (14 distinct settings: utilization
# 0.15 to 0.92, max_num_batched_tokens 2048 to 29028; benchmarks/kv_budget.py): every residual within 1.6%.
CUDA_RESERVED_BYTES = int(0.57 * GiB)  # of the card's total as nvidia-smi reports it: the CUDA context's
CUDA_OVERHEAD_BYTES = int(0.40 * GiB)  # memory outside torch's allocator once the model has run
ACTIVATION_FACTOR = 2.9  # peak activation = factor x batched tokens x (hidden + intermediate) x dtype bytes
# With an fp8 KV cache vLLM holds about one batch's KV at the model's dtype besides (fitted on the three fp8-KV
# startups measured, Llama-3.1-8B and Qwen2.5-32B on an H100 and an H200: residuals -1.6% to +1.4%; without it the
# 32B's were +3.6% and +6.9%). Read as the batch's keys and values before they are quantized into the cache.
FP8_KV_BATCH_COPIES = 1.0
# The estimate's stated error: the largest of the calibration rows (Qwen2.5-32B fp8, 3.6%), rounded up.
# An explicit KV budget is exact (measured on the CPU build: BENCHMARKS.md, "KV budget estimate").
ESTIMATE_ERROR = 0.05
# The CPU build without an explicit budget keeps the utilization's share of RAM less its own resident memory
# (weights, runtime), which is known only after its warm-up: not calibrated, so a wide error.
CPU_UTILIZATION_ERROR = 0.25

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
                "fp8_e5m2": 1}
# Bytes of one quantized weight, by the method vLLM runs it with: online fp8 (`--quantization fp8`), or a checkpoint
# quantized already (its config's quantization_config.quant_method). Embeddings, the output projection and norms
# stay at the model's dtype (`ModelMemory.unquantized_parameters`).
QUANTIZED_WEIGHT_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "modelopt": 1.0, "awq": 0.5, "gptq": 0.5,
                          "awq_marlin": 0.5, "gptq_marlin": 0.5}


@dataclass(frozen=True)
class ModelMemory:
    """The sizes of a model that decide its memory: weights, KV cache per token, activations per token."""

    architecture: str
    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    parameters: int
    dtype: str  # the config's own, e.g. bfloat16
    max_position_embeddings: int
    # Left at the model's dtype when the linear layers are quantized: embeddings, output projection, norms.
    unquantized_parameters: int = 0
    quantization: str | None = None  # the checkpoint's own method (its config's quant_method), None for none

    def dtype_bytes(self, dtype: str | None = None) -> int:
        """Bytes of one value in the engine's dtype (None or auto: the config's)."""
        return _DTYPE_BYTES[self.dtype if dtype in (None, "auto") else dtype]

    def weight_bytes(self, dtype: str | None = None, quantization: str | None = None) -> int:
        """Bytes of the weights in `dtype` (None or auto: the config's): the linear layers' at the bytes of the
        quantization (`quantization`, else the checkpoint's own, else none), the rest at the dtype's."""
        method = quantization or self.quantization
        per_weight = QUANTIZED_WEIGHT_BYTES.get(method) if method else None
        if per_weight is None:
            return self.parameters * self.dtype_bytes(dtype)
        kept = self.unquantized_parameters
        return int((self.parameters - kept) * per_weight) + kept * self.dtype_bytes(dtype)

    def kv_bytes_per_token(self, dtype: str | None = None, kv_cache_dtype: str | None = None) -> int:
        """layers x (K, V) x KV heads x head size x bytes of the KV cache dtype (auto: the model's dtype)."""
        value = self.dtype_bytes(dtype) if kv_cache_dtype in (None, "auto") else _DTYPE_BYTES[kv_cache_dtype]
        return self.layers * 2 * self.kv_heads * self.head_dim * value

    def activation_bytes(self, batched_tokens: int, dtype: str | None = None) -> int:
        """Peak activation memory of one batch of `batched_tokens` (vLLM profiles the largest batch)."""
        width = self.hidden_size + self.intermediate_size
        return int(ACTIVATION_FACTOR * batched_tokens * width * self.dtype_bytes(dtype))


def read_model_memory(path: str | Path) -> ModelMemory:
    """A model folder's sizes from its config, as transformers reads it; one line naming the cause if not."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise TunerError(f"{folder}: not a model folder (no config.json)")
    # Imported here: transformers takes seconds to import and most commands never need it.
    # lazy: keeps the CLI's start fast (transformers)
    from transformers import AutoConfig
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity(logging.ERROR)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, TypeError, ZeroDivisionError, OSError) as exc:
        message = " ".join(str(exc).split())
        if "does not recognize this architecture" in message:
            model_type = message.split("model type `", 1)[-1].split("`", 1)[0]
            raise TunerError(f"{folder}: unknown architecture {model_type!r} (not known to transformers)") from None
        raise TunerError(f"{folder}/config.json: not a usable model config "
                         f"({exc.__class__.__name__}: {message[:160]})") from None
    text = config.get_text_config()
    try:
        heads = int(text.num_attention_heads)
        hidden = int(text.hidden_size)
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        layers = int(text.num_hidden_layers)
        intermediate = int(text.intermediate_size)
        vocab = int(text.vocab_size)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise TunerError(f"{folder}/config.json: not a usable model config ({exc})") from None
    dtype = str(getattr(text, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
    dtype = dtype.removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise TunerError(f"{folder}/config.json: unknown dtype {dtype!r}")
    # A dense decoder: attention (q, k, v, o), a gated MLP of three matrices, two norms per layer, the embedding
    # and, unless tied, the output projection. Mixture-of-experts configs repeat the MLP per expert.
    experts = int(getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None) or 1)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    per_layer = attention + experts * 3 * hidden * intermediate + 2 * hidden
    embeddings = vocab * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return ModelMemory(
        architecture=(getattr(config, "architectures", None) or [type(config).__name__])[0],
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, hidden_size=hidden, intermediate_size=intermediate,
        parameters=layers * per_layer + embeddings + hidden, dtype=dtype,
        max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 2048),
        unquantized_parameters=embeddings + layers * 2 * hidden + hidden,
        quantization=checkpoint_quantization(config))


def checkpoint_quantization(config) -> str | None:
    """The method a checkpoint is quantized with already, as its config names it (quantization_config's
    quant_method: a dict in config.json, an object once transformers has read it); None for none."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(getattr(method, "value", method)) if method else "unknown"


@dataclass(frozen=True)
class DeviceMemory:
    """The memory an engine runs in: one GPU's total as nvidia-smi reports it, or the machine's RAM."""

    platform: str  # "cuda" or "cpu"
    total_bytes: int

    def __post_init__(self) -> None:
        if self.total_bytes <= 0:
            raise TunerError(f"device memory must be above 0, got {self.total_bytes} bytes")

    @classmethod
    def of(cls, platform: str, gib: float) -> DeviceMemory:
        """A device of `platform` ("cuda" or "cpu") with `gib` GiB of memory."""
        return cls(platform, int(gib * GiB))

    @classmethod
    def of_machine(cls, hardware: HardwareInfo) -> DeviceMemory:
        """One GPU of this machine, or its RAM without one."""
        if hardware.accelerator == "cuda" and hardware.gpu_memory_gib:
            return cls.of("cuda", hardware.gpu_memory_gib)
        return cls.of("cpu", hardware.memory_gib)


class Fit(str, enum.Enum):
    """How one request of a context length compares with an estimate, its error included."""

    FITS = "fits"  # even the lowest the KV cache could be holds it
    NEAR = "near"  # within the error either way: launched, and the outcome recorded beside the estimate
    SHORT = "short"  # even the highest the KV cache could be cannot hold it: kv_insufficient (predicted)


@dataclass(frozen=True)
class KvEstimate:
    """The KV cache vLLM is expected to allocate for one configuration."""

    tokens: int  # whole blocks, as vLLM allocates them
    bytes: int  # before rounding to blocks; below 0 when the weights and overheads leave nothing
    basis: str  # the setting that decided it: kv_cache_memory_bytes, num_gpu_blocks_override or gpu_memory_utilization
    error: float  # relative: the real figure lies within tokens x (1 -/+ error)
    longest_context: int  # the longest max_model_len that fits: tokens, at most the model's positions

    def fit(self, context_len: int) -> Fit:
        """Whether one request of `context_len` tokens fits in the estimated cache, its error allowed for: FITS, SHORT,
        or NEAR when the error spans it."""
        if self.tokens * (1 - self.error) >= context_len:
            return Fit.FITS
        if self.tokens * (1 + self.error) < context_len:
            return Fit.SHORT
        return Fit.NEAR

    def describe(self) -> str:
        """The estimate in words: tokens, the error if any, and its basis."""
        spread = f" (+/-{self.error:.0%})" if self.error else ""
        return f"{self.tokens:,} tokens{spread} from {self.basis}"

    def to_dict(self) -> dict:
        """JSON-ready: tokens, bytes, basis, error and the longest context."""
        return {"tokens": self.tokens, "bytes": self.bytes, "basis": self.basis, "error": self.error,
                "longest_context": self.longest_context}


@dataclass(frozen=True)
class KvPrediction:
    """What was expected of a launched configuration's KV cache, kept beside what vLLM then logged."""

    estimate: KvEstimate
    context_len: int  # max_model_len as vLLM runs it
    fit: Fit

    def to_dict(self) -> dict:
        """JSON-ready: the estimate's fields, the context length and the fit's value (what a trial's user attribute
        keeps)."""
        return {**self.estimate.to_dict(), "context_len": self.context_len, "fit": self.fit.value}


def estimate_kv(model: ModelMemory, device: DeviceMemory, config: EngineConfig) -> KvEstimate:
    """The KV cache, in tokens, that vLLM will allocate for `config` on `device`."""
    block = config.block_size or BLOCK_TOKENS[device.platform]
    gpus = config.tensor_parallel_size or 1
    per_token = model.kv_bytes_per_token(config.dtype, config.kv_cache_dtype)
    if config.num_gpu_blocks_override is not None:
        tokens = config.num_gpu_blocks_override * block
        return KvEstimate(tokens, tokens * per_token, "num_gpu_blocks_override", 0.0,
                          min(tokens, model.max_position_embeddings))
    if config.kv_cache_memory_bytes is not None:
        budget, basis, error = config.kv_cache_memory_bytes * gpus, "kv_cache_memory_bytes", 0.0
    else:
        budget = usable_kv_bytes(model, device, config)
        basis = "gpu_memory_utilization"
        error = ESTIMATE_ERROR if device.platform == "cuda" else CPU_UTILIZATION_ERROR
    tokens = max(budget, 0) // (per_token * block) * block
    return KvEstimate(tokens, budget, basis, error, min(tokens, model.max_position_embeddings))


def usable_kv_bytes(model: ModelMemory, device: DeviceMemory, config: EngineConfig) -> int:
    """Bytes left for the KV cache over all GPUs of the engine: the utilization's share of each card, less the
    weights, the peak activations of the largest batch and the fixed overhead (below 0: nothing is left)."""
    utilization = config.gpu_memory_utilization or VLLM_DEFAULT_UTILIZATION
    gpus = config.tensor_parallel_size or 1
    reserved = CUDA_RESERVED_BYTES if device.platform == "cuda" else 0
    batched = config.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS[device.platform]
    staging = FP8_KV_BATCH_COPIES * batched * model.kv_bytes_per_token(config.dtype) if config.fp8_kv_cache else 0
    per_gpu = (utilization * (device.total_bytes - reserved) - CUDA_OVERHEAD_BYTES
               - (model.activation_bytes(batched, config.dtype) + staging) / gpus)
    return int(per_gpu * gpus - model.weight_bytes(config.dtype, config.quantization))


_KV_LOGGED = re.compile(r"KV cache size: ([\d,]+) tokens")


def logged_kv_tokens(log_text: str) -> int | None:
    """The KV cache size vLLM logged at startup ("GPU KV cache size: 921,696 tokens"; the CPU build says CPU),
    the last one if several."""
    found = _KV_LOGGED.findall(log_text)
    return int(found[-1].replace(",", "")) if found else None
