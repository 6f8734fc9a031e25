"""The built-in rules: what vLLM refuses to start with, checked on every proposal before launch so that an
impossible configuration costs no trial. Each rule returns why a configuration is infeasible, or None."""

from __future__ import annotations

from collections.abc import Callable

from tuner.analysis.kv_budget import Fit, estimate_kv
from tuner.search_spaces.context import PLATFORMS, SpaceContext
from tuner.workers.engine_config import EngineConfig

# How a proposal refused for its estimated KV cache is named, in its reasons and as its failure class.
PREDICTED_KV_INSUFFICIENT = "kv_insufficient (predicted)"


def _context_len(config: EngineConfig, context: SpaceContext) -> int:
    """max_model_len as vLLM runs it: unset means the model's own."""
    return config.max_model_len if config.max_model_len is not None else context.model_max_len


def _context_label(config: EngineConfig, context: SpaceContext) -> str:
    if config.max_model_len is not None:
        return f"max_model_len ({config.max_model_len})"
    return f"max_model_len (unset: the model's {context.model_max_len})"


def batched_tokens_cover_seqs(config: EngineConfig, context: SpaceContext) -> str | None:
    """max_num_batched_tokens >= max_num_seqs: vLLM refuses to start otherwise. Checked when both are set."""
    if config.max_num_batched_tokens is None or config.max_num_seqs is None:
        return None
    if config.max_num_batched_tokens >= config.max_num_seqs:
        return None
    return (f"max_num_batched_tokens ({config.max_num_batched_tokens}) is below max_num_seqs "
            f"({config.max_num_seqs}); vLLM requires at least one token per sequence in a batch")


def context_holds_longest_request(config: EngineConfig, context: SpaceContext) -> str | None:
    """max_model_len >= the trace's longest request, unless the trace is fitted (clip or scale) to it."""
    if context.fit is not None or _context_len(config, context) >= context.longest_request_tokens:
        return None
    return (f"{_context_label(config, context)} is below the trace's longest request "
            f"({context.longest_request_tokens} tokens); fit the trace (clip or scale) to allow a shorter context")


def context_within_model(config: EngineConfig, context: SpaceContext) -> str | None:
    """max_model_len <= the model's max_position_embeddings: vLLM refuses a longer context."""
    if config.max_model_len is None or config.max_model_len <= context.model_max_len:
        return None
    return (f"max_model_len ({config.max_model_len}) is above the model's max_position_embeddings "
            f"({context.model_max_len})")


def dtype_on_platform(config: EngineConfig, context: SpaceContext) -> str | None:
    """dtype must be one the platform supports (see PLATFORMS)."""
    supported = PLATFORMS[context.platform].dtypes
    if config.dtype is None or config.dtype in supported:
        return None
    return f"dtype {config.dtype} is not available on {context.platform} (supported: {', '.join(supported)})"


def numerics_allowed(config: EngineConfig, context: SpaceContext) -> str | None:
    """FP8 weights or KV cache only where the study allows them and the machine runs them (vLLM's CPU build has
    neither; a GPU needs compute capability 8.9)."""
    what = config.numerics_text()
    if what is None or context.fp8_refused is None:
        return None
    return f"{what}: {context.fp8_refused}"


def kv_cache_holds_one_request(config: EngineConfig, context: SpaceContext) -> str | None:
    """The estimated KV cache holds one request of max_model_len: vLLM refuses to start otherwise. Refused only
    when even the estimate's error could not make it fit; a proposal near the margin is launched."""
    if context.model_memory is None or context.device is None:
        return None
    estimate = estimate_kv(context.model_memory, context.device, config)
    if estimate.fit(_context_len(config, context)) is not Fit.SHORT:
        return None
    if estimate.bytes <= 0:
        weights = context.model_memory.weight_bytes(config.dtype) / 2**30
        return (f"{PREDICTED_KV_INSUFFICIENT}: the weights ({weights:.1f} GiB) and the engine's overheads leave no "
                f"KV cache at gpu_memory_utilization {config.gpu_memory_utilization or 'default'}")
    return (f"{PREDICTED_KV_INSUFFICIENT}: the KV cache is estimated at {estimate.describe()}, "
            f"below one request of {_context_label(config, context)}")


def unchunked_batch_holds_context(config: EngineConfig, context: SpaceContext) -> str | None:
    """With enable_chunked_prefill false, max_num_batched_tokens >= max_model_len: vLLM refuses otherwise.

    Checked when max_num_batched_tokens is set (vLLM's own default is large enough).
    """
    if config.enable_chunked_prefill is not False or config.max_num_batched_tokens is None:
        return None
    if config.max_num_batched_tokens >= _context_len(config, context):
        return None
    return (f"max_num_batched_tokens ({config.max_num_batched_tokens}) is below "
            f"{_context_label(config, context)} with enable_chunked_prefill false; a whole prompt must fit one batch")


Rule = Callable[[EngineConfig, SpaceContext], str | None]
BUILT_IN_RULES: tuple[Rule, ...] = (
    batched_tokens_cover_seqs, context_holds_longest_request, context_within_model,
    dtype_on_platform, numerics_allowed, unchunked_batch_holds_context, kv_cache_holds_one_request,
)
