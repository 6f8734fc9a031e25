"""The most traffic a KV cache can carry, known before a launch: a configuration that cannot carry the best so far's
req/s by its KV cache is not launched.

By Little's law the tokens a cache holds on average are the arrival rate times what each request holds over its
stay, in token-seconds. A request holds at least its prompt and the tokens it has generated so far through every
step of its decode, and no step is faster than the fastest per-token time the study measured on an engine that
computes a step the same way. So, over the trace's requests (as selected and fitted),

    req/s <= KV tokens / mean of (output - 1) x (prompt + output / 2) x fastest per-token time

and of that only the share the trace's fit left whole counts, as in a trial's score (`Score.carried_rps`).

Every term errs high: the estimate's upper end, prompts of shared prefix blocks counted as held by no one (prefix
caching shares them), the prefill, the queue and preemptions left out, and an allowance for a probe passing an
engine somewhat overloaded.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from tuner.analysis.kv_budget import KvEstimate
from tuner.traces.records import PREFIX_BLOCK_TOKENS, Trace, TraceRequest
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement

# A probe lasts seconds, not a long run: an engine somewhat overloaded can pass one before its queue shows (10%
# overload passes up to a tenth of the main job's probes: benchmarks/pace_false_failures.py). The bound allows a
# quarter more than Little's law gives.
PROBE_OVERLOAD_ALLOWED = 1.25
# The settings that change what one step of the engine costs: a per-token time measured with other values is no
# floor for this one (FP8 weights or CUDA graphs make a step faster).
STEP_SETTINGS = ("dtype", "quantization", "kv_cache_dtype", "tensor_parallel_size", "enforce_eager")


@dataclass(frozen=True)
class KvTrafficBound:
    """The most req/s a configuration's KV cache can carry of a trace, and what that rests on."""

    rps: float  # carried whole (`Score.carried_rps`), with the estimate's upper end and the probe's allowance
    kv_tokens: int  # the estimate, before its error
    token_seconds: float  # the least a request holds over its stay, on average over the trace

    def reason(self, best_rps: float) -> str:
        """Why a configuration below `best_rps` is not launched, in one line."""
        return (f"at most {self.rps:.3g} req/s by its KV cache (estimate {self.kv_tokens:,} tokens), below the best "
                f"so far, {best_rps:.3g} req/s")


def tpot_floor(measured: Iterable[tuple[EngineConfig, Measurement]], config: EngineConfig) -> float | None:
    """The fastest per-token time (`Measurement.tpot_fastest_s`) measured with `config`'s step settings; None when
    none was."""
    same_step = [m.tpot_fastest_s for c, m in measured
                 if m.tpot_fastest_s is not None and all(getattr(c, s) == getattr(config, s) for s in STEP_SETTINGS)]
    return min(same_step, default=None)


def _held_token_steps(request: TraceRequest, prefix_caching: bool) -> float:
    """Tokens held summed over the request's decode steps: prompt + k at step k, k = 1 .. output - 1. With prefix
    caching its prefix blocks may be shared with other requests in flight, so they are not counted."""
    shared = min(request.input_tokens, len(request.prefix_blocks) * PREFIX_BLOCK_TOKENS) if prefix_caching else 0
    steps = request.output_tokens - 1
    return max(steps, 0) * (request.input_tokens - shared + request.output_tokens / 2)


def kv_traffic_bound(estimate: KvEstimate, trace: Trace, tpot_floor_s: float,
                     config: EngineConfig) -> KvTrafficBound | None:
    """The most req/s of `trace` that `config`'s KV cache (`estimate`) can carry whole (a request its fit clipped
    is served but not carried), each decode step taking at least `tpot_floor_s`. None when the trace's requests
    hold nothing through a decode (no bound)."""
    prefix_caching = config.enable_prefix_caching is not False  # vLLM's default is on
    token_seconds = tpot_floor_s * statistics.fmean(_held_token_steps(r, prefix_caching) for r in trace.requests)
    if token_seconds <= 0:
        return None
    most_tokens = estimate.tokens * (1 + estimate.error)
    rps = PROBE_OVERLOAD_ALLOWED * most_tokens / token_seconds * trace.whole_share
    return KvTrafficBound(rps, estimate.tokens, token_seconds)
