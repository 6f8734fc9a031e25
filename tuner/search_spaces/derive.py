"""A search space derived from the model, the device and the trace, with the reason for every range.

The KV budget decides most of it (tuner.analysis.kv_budget): the contexts come from the trace's lengths, the memory
range from the least that holds one request of the shortest context, the batch sizes from the cache over the trace's
mean context and from its prompt lengths, each a short grid because it keys vLLM's compile cache. The result is written
as a search space file, reasons as comments, and stored with a study like a hand-written one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from tuner.search_spaces import SearchSpace, parse_space
from tuner.common.errors import TunerError
from tuner.analysis.kv_budget import GiB, BLOCK_TOKENS, DeviceMemory, Fit, ModelMemory, estimate_kv
from tuner.traces.records import Trace
from tuner.traces.stats import percentile
from tuner.workers.engine_config import EngineConfig

AUTO_SPACE = "auto"  # `--space auto`: derive the space instead of reading a file
CONTEXT_PERCENTILES = (50, 90, 99, 100)
CONTEXT_STEP = 256  # max_model_len choices are rounded up to this
UTILIZATION_STEP = 0.05
UTILIZATION_HIGH = 0.95  # the rest of the card stays free for the CUDA context and other processes
MAX_SEQS_CAP = 1024  # vLLM's own default on the largest GPUs
PROMPT_BATCHES = 4  # max_num_batched_tokens reaches this many of the trace's p99 prompts in one step
# Settings that key vLLM's compile cache (max_num_batched_tokens, and max_num_seqs through the CUDA graph sizes)
# are offered as a grid of at most this many values, not a range: each value compiles once a study, and every
# later trial with it starts warm (docs/search-spaces.md, "Launches that reuse compiled graphs").
GRID_VALUES = 4
CPU_SHARE_CAP = 0.25  # of RAM, at most, for the KV cache on a machine that others share


@dataclass(frozen=True)
class DerivedRange:
    """One setting of a derived space: the values offered and why."""

    setting: str
    values: str  # as offered, e.g. "1024, 2048" or "0.30 to 0.95 (step 0.05)"
    reason: str

    def to_dict(self) -> dict:
        """JSON-ready: the setting, its values and the reason."""
        return {"setting": self.setting, "values": self.values, "reason": self.reason}


@dataclass(frozen=True)
class DerivedSpace:
    """A search space derived for a model, machine and trace: the space as a study will read it, and each derived range
    with its reason."""

    space: SearchSpace  # parsed back from `space.text`, as a study will read it
    ranges: tuple[DerivedRange, ...]

    def to_dict(self) -> dict:
        """JSON-ready: the ranges and the space file's text."""
        return {"ranges": [r.to_dict() for r in self.ranges], "text": self.space.text}


def _round_up(value: float, step: int) -> int:
    return max(step, math.ceil(value / step) * step)


def _grid(low: int, high: int) -> list[int]:
    """At most GRID_VALUES values from `low` to `high`, both kept as derived: evenly apart on a log scale, those
    between rounded to the nearest power of two."""
    if high <= low:
        return [low]
    span = math.log2(high) - math.log2(low)
    inner = (2 ** round(math.log2(low) + span * k / (GRID_VALUES - 1)) for k in range(1, GRID_VALUES - 1))
    return sorted({low, high, *(v for v in inner if low < v < high)})


def _context_choices(contexts: list[int], model: ModelMemory, fit: str | None) -> list[tuple[int, float]]:
    """max_model_len at the trace's context percentiles, each with the share of requests it would clip."""
    longest = max(contexts)
    if fit is None and longest > model.max_position_embeddings:
        raise TunerError(f"the trace's longest request ({longest} tokens) is beyond the model's context "
                         f"({model.max_position_embeddings}); fit the trace (--fit clip or scale)")
    choices: list[tuple[int, float]] = []
    for q in CONTEXT_PERCENTILES:
        value = min(_round_up(percentile(contexts, q), CONTEXT_STEP), model.max_position_embeddings)
        # An unfitted trace needs every request whole: a shorter context would be refused by the rules.
        if (fit is None and value < longest) or value in (c for c, _ in choices):
            continue
        choices.append((value, sum(c > value for c in contexts) / len(contexts)))
    return choices


def derive_space(model: ModelMemory, device: DeviceMemory, trace: Trace, fit: str | None,
                 fp8: bool = False) -> DerivedSpace:
    """The space for replaying `trace` (as it will be replayed, before fitting) against `model` on `device`; with
    `fp8` (allowed by the study and run by the device), FP8 weights and KV cache are searched too."""
    if not trace.requests:
        raise TunerError(f"{trace.source}: trace has no requests")
    contexts = [r.input_tokens + r.output_tokens for r in trace.requests]
    prompts = [r.input_tokens for r in trace.requests]
    mean_context = statistics.fmean(contexts)
    derivation = _Derivation(model, device, trace, _context_choices(contexts, model, fit), fp8)
    derivation.kv_budget()
    derivation.contexts()
    derivation.batch(mean_context, prompts)
    derivation.precision_options()
    derivation.cache_options()
    return derivation.result()


class _Derivation:
    """The settings of one derived space, built up one decision at a time."""

    def __init__(self, model: ModelMemory, device: DeviceMemory, trace: Trace, choices: list[tuple[int, float]],
                 fp8: bool):
        self.model, self.device, self.trace, self.choices, self.fp8 = model, device, trace, choices, fp8
        self.fixed: dict = {"enable_chunked_prefill": True}
        self.parameters: dict = {}
        self.ranges: list[DerivedRange] = [DerivedRange(
            "enable_chunked_prefill", "true", "fixed: max_num_batched_tokens below max_model_len needs it")]
        self.block = BLOCK_TOKENS[device.platform]
        self.low_config = self.high_config = EngineConfig()  # the smallest and largest KV budget offered

    def tokens(self, config: EngineConfig) -> int:
        return estimate_kv(self.model, self.device, config).tokens

    def kv_budget(self) -> None:
        """The setting that sizes the KV cache: gpu_memory_utilization on a GPU, blocks of a fixed budget on CPU."""
        shortest = self.choices[0][0]
        if self.device.platform == "cuda":
            self._utilization(shortest)
        else:
            self._cpu_blocks(shortest)

    def _utilization(self, shortest: int) -> None:
        top = EngineConfig(gpu_memory_utilization=UTILIZATION_HIGH)
        estimate = estimate_kv(self.model, self.device, top)
        if estimate.bytes <= 0:
            raise TunerError(f"the GPU's {self.device.total_bytes / GiB:.1f} GiB cannot hold the model's weights "
                             f"({self.model.weight_bytes() / GiB:.1f} GiB) and the engine's overheads")
        if estimate.fit(shortest) is not Fit.FITS:
            raise TunerError(f"the GPU's {self.device.total_bytes / GiB:.1f} GiB leave a KV cache of "
                             f"{estimate.describe()} beside the weights, short of one request of {shortest} tokens")
        steps = range(1, round(UTILIZATION_HIGH / UTILIZATION_STEP) + 1)
        low = next(round(k * UTILIZATION_STEP, 2) for k in steps if estimate_kv(
            self.model, self.device, EngineConfig(gpu_memory_utilization=round(k * UTILIZATION_STEP, 2)))
            .fit(shortest) is Fit.FITS)
        self.low_config = EngineConfig(gpu_memory_utilization=low)
        # The largest budget the space offers: with FP8 weights and KV cache where precision_options offers them, so
        # that the contexts and batch sizes only FP8 makes room for are offered too (the rules refuse what does not
        # fit).
        fp8 = self.fp8
        self.high_config = replace(top, kv_cache_dtype="fp8", quantization=self._weights_fp8()) if fp8 else top
        self.parameters["gpu_memory_utilization"] = {"type": "float", "low": low, "high": UTILIZATION_HIGH,
                                                     "step": UTILIZATION_STEP}
        weights = self.model.weight_bytes() / GiB
        self.ranges.append(DerivedRange(
            "gpu_memory_utilization", f"{low:.2f} to {UTILIZATION_HIGH:.2f} (step {UTILIZATION_STEP})",
            f"from the least whose KV cache ({self.tokens(self.low_config):,} tokens beside {weights:.1f} GiB of "
            f"weights) holds one request of the shortest context ({shortest}); up to "
            f"{self.tokens(top):,} tokens at {UTILIZATION_HIGH}"
            + (f" ({self.tokens(self.high_config):,} with {self.high_config.numerics_text()})" if fp8 else "")))

    def _cpu_blocks(self, shortest: int) -> None:
        per_block = self.model.kv_bytes_per_token() * self.block
        whole_trace = sum(r.input_tokens + r.output_tokens for r in self.trace.requests)
        # Enough for the whole trace in flight at once (more cannot be used) and for the baseline's context.
        wanted = max(whole_trace, self.model.max_position_embeddings)
        blocks_high = math.ceil(wanted / self.block)
        if blocks_high * per_block > CPU_SHARE_CAP * self.device.total_bytes:
            blocks_high = int(CPU_SHARE_CAP * self.device.total_bytes // per_block)
        blocks_low = math.ceil(shortest / self.block)
        if blocks_high < blocks_low:
            raise TunerError(f"a quarter of this machine's {self.device.total_bytes / GiB:.1f} GiB cannot hold "
                             f"one request of {shortest} tokens of KV cache")
        self.fixed.update(enforce_eager=True, kv_cache_memory_bytes=blocks_high * per_block)
        self.parameters["num_gpu_blocks_override"] = {"type": "int", "low": blocks_low, "high": blocks_high,
                                                      "log": True}
        self.low_config = EngineConfig(num_gpu_blocks_override=blocks_low)
        self.high_config = EngineConfig(num_gpu_blocks_override=blocks_high)
        self.ranges += [
            DerivedRange("enforce_eager", "true", "fixed: compiling the model on CPU takes minutes per launch"),
            DerivedRange("kv_cache_memory_bytes", f"{blocks_high * per_block:,}",
                         "fixed: the CPU build's default share of RAM is refused on a shared machine; this holds "
                         f"the whole trace at once ({whole_trace:,} tokens) and the model's full context"),
            DerivedRange("num_gpu_blocks_override", f"{blocks_low} to {blocks_high} (log)",
                         f"the KV budget in blocks of {self.block} tokens: from one request of the shortest context "
                         f"({shortest}) to the whole trace in flight"),
        ]

    def contexts(self) -> None:
        """max_model_len from the trace's length percentiles; those the largest budget cannot hold are left out."""
        largest = estimate_kv(self.model, self.device, self.high_config)
        offered = [(c, share) for c, share in self.choices if largest.fit(c) is Fit.FITS]
        left_out = [c for c, share in self.choices if (c, share) not in offered]
        if not offered:
            raise TunerError(f"the largest KV budget offered ({largest.describe()}) holds none of the contexts "
                             f"the trace needs ({', '.join(str(c) for c, _ in self.choices)})")
        self.parameters["max_model_len"] = {"type": "categorical", "choices": [c for c, _ in offered]}
        clipped = ", ".join(f"{c}: {share:.0%} clipped" for c, share in offered)
        reason = f"the trace's context length at p{'/p'.join(map(str, CONTEXT_PERCENTILES))} ({clipped})"
        if left_out:
            reason += f"; {', '.join(map(str, left_out))} left out: beyond the largest KV budget offered"
        self.ranges.append(DerivedRange("max_model_len", ", ".join(str(c) for c, _ in offered), reason))

    def batch(self, mean_context: float, prompts: list[int]) -> None:
        """max_num_seqs from the KV budget over the mean context; max_num_batched_tokens from the prompts."""
        cap = min(MAX_SEQS_CAP, len(self.trace.requests))
        high = max(1, min(cap, int(self.tokens(self.high_config) / mean_context)))
        low = max(1, min(high, int(self.tokens(self.low_config) / mean_context)))
        self._grid_of("max_num_seqs", low, high,
                      f"the KV budget over the trace's mean context ({mean_context:.0f} tokens), from the smallest "
                      f"budget to the largest, at most {cap} (the trace's requests, or vLLM's largest default)")
        batched_low = _round_up(percentile(prompts, 50), CONTEXT_STEP)
        batched_high = max(_round_up(PROMPT_BATCHES * percentile(prompts, 99), CONTEXT_STEP), 2 * batched_low)
        self._grid_of("max_num_batched_tokens", batched_low, batched_high,
                      f"from the median prompt ({percentile(prompts, 50):.0f} tokens) in one step to "
                      f"{PROMPT_BATCHES} of the p99 prompts ({percentile(prompts, 99):.0f})")

    def _grid_of(self, setting: str, low: int, high: int, reason: str) -> None:
        """A setting that keys vLLM's compile cache, offered as a short grid from `low` to `high`."""
        values = _grid(low, high)
        self.parameters[setting] = {"type": "categorical", "choices": values}
        self.ranges.append(DerivedRange(
            setting, ", ".join(map(str, values)),
            f"{reason}; a grid of {len(values)}, not a range: it keys vLLM's compile cache, so each value compiles "
            "once a study and later trials with it start warm"))

    def _weights_fp8(self) -> str | None:
        """fp8 for online quantization of the weights, unless the checkpoint is quantized already (it keeps its own)."""
        return None if self.model.quantization else "fp8"

    def precision_options(self) -> None:
        """FP8 weights and KV cache where the study allows them and the device runs them: they change the model's
        numerics, so never otherwise."""
        if not self.fp8:
            for setting in ("quantization", "kv_cache_dtype"):
                self.ranges.append(DerivedRange(setting, "not searched", "FP8 not allowed or not run here: the "
                                                "checkpoint's own precision"))
            return
        self.parameters["kv_cache_dtype"] = {"type": "categorical", "choices": ["auto", "fp8"]}
        self.ranges.append(DerivedRange("kv_cache_dtype", "auto, fp8",
                                        "fp8 halves the KV cache's bytes per token (changes numerics: allowed)"))
        if self._weights_fp8() is None:
            self.ranges.append(DerivedRange("quantization", "not searched",
                                            f"the checkpoint is quantized already ({self.model.quantization}): it "
                                            "keeps its own"))
            return
        fp8_weights = self.model.weight_bytes(quantization="fp8") / GiB
        self.parameters["quantization"] = {"type": "categorical", "choices": [None, "fp8"]}
        self.ranges.append(DerivedRange(
            "quantization", "none, fp8", f"FP8 weights ({fp8_weights:.1f} GiB against "
            f"{self.model.weight_bytes() / GiB:.1f}) leave more memory to the KV cache and compute faster on Hopper "
            "(changes numerics: allowed)"))

    def cache_options(self) -> None:
        """Prefix caching where the trace repeats prefix blocks."""
        blocks = [b for r in self.trace.requests for b in r.prefix_blocks]
        repeated = len(blocks) - len(set(blocks))
        if repeated:
            self.parameters["enable_prefix_caching"] = {"type": "categorical", "choices": [True, False]}
            self.ranges.append(DerivedRange("enable_prefix_caching", "true, false",
                                            f"{repeated} of the trace's {len(blocks)} prefix blocks repeat an "
                                            "earlier one"))
        else:
            self.ranges.append(DerivedRange("enable_prefix_caching", "not searched (vLLM's default)",
                                            "no prefix block of the trace repeats"))

    def result(self) -> DerivedSpace:
        comments = [f"# {r.setting}: {r.values}: {r.reason}" for r in self.ranges]
        where = "one GPU" if self.device.platform == "cuda" else "CPU"
        header = [f"# Derived by tuner (`--space auto`, `tuner space suggest`) for {self.model.architecture} on "
                  f"{where} of {self.device.total_bytes / GiB:.1f} GiB, replaying {Path(self.trace.source).name} "
                  f"({len(self.trace.requests)} requests).", *comments]
        body = yaml.safe_dump({"name": AUTO_SPACE, "description": f"derived for {self.model.architecture} on "
                               f"{where} of {self.device.total_bytes / GiB:.1f} GiB",
                               "fixed": self.fixed, "parameters": self.parameters},
                              sort_keys=False, default_flow_style=None, width=120)
        text = "\n".join(header) + "\n" + body
        return DerivedSpace(parse_space(text, Path(f"{AUTO_SPACE}.yaml")), tuple(self.ranges))
