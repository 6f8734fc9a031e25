"""One engine configuration: the vLLM settings a trial tries. Unset fields keep vLLM's own defaults."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tuner.common.errors import TunerError

_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16")
# Online quantization of a checkpoint at its own precision, as vLLM's --quantization takes it: fp8 weights, their
# scales computed at load. A checkpoint quantized already keeps its own method (read from its config), unset here.
QUANTIZATIONS = ("fp8",)
# vLLM and torch keep these counts in 32-bit integers; a larger value would only fail at launch. A byte count
# may be larger, up to what a float holds exactly (8 PiB).
_COUNT_MAX = 2**31 - 1
_BYTES_MAX = 2**53



def _shown(value: int | float) -> int | float | str:
    """A number as an error message shows it: whole when short, else in three digits."""
    if value < 10**15:
        return value
    try:
        return f"{value:.3g}"
    except OverflowError:  # an integer past float's range (10**400 in a file): its size says enough
        return f"a number of {len(str(value))} digits"

@dataclass(frozen=True)
class EngineConfig:
    """The vLLM settings of one trial, each checked on creation (TunerError for a value vLLM would refuse); a field left
    None is not passed and keeps vLLM's default."""

    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    enforce_eager: bool | None = None
    tensor_parallel_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "block_size",
                     "kv_cache_memory_bytes", "num_gpu_blocks_override", "tensor_parallel_size"):
            value = getattr(self, name)
            if value is None:
                continue
            if value < 1:
                raise TunerError(f"{name} must be at least 1, got {value}")
            most = _BYTES_MAX if name == "kv_cache_memory_bytes" else _COUNT_MAX
            if value > most:
                raise TunerError(f"{name} must be at most {most}, got {_shown(value)}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise TunerError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise TunerError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise TunerError(f"kv_cache_dtype must be one of {', '.join(_KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise TunerError(f"quantization must be one of {', '.join(QUANTIZATIONS)} (a checkpoint quantized "
                             f"already keeps its own), got {self.quantization!r}")

    @property
    def fp8_kv_cache(self) -> bool:
        """Whether the KV cache is kept in FP8 (any of vLLM's fp8 kinds)."""
        return (self.kv_cache_dtype or "auto").startswith("fp8")

    @property
    def changes_numerics(self) -> bool:
        """Whether this configuration computes with other numbers than the checkpoint's own precision: weights
        quantized at load, or a KV cache in fp8. Outputs then differ from the checkpoint's."""
        return self.numerics_text() is not None

    def numerics_text(self) -> str | None:
        """What changes numerics, in words ("weights and KV cache in FP8"); None when nothing does."""
        parts = [name for name, changed in (("weights", self.quantization is not None),
                                            ("KV cache", self.fp8_kv_cache)) if changed]
        return f"{' and '.join(parts)} in FP8" if parts else None

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that were set: the rest is vLLM's default."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def cli_args(self) -> list[str]:
        """The `vllm serve` flags for this configuration, as argv items (never joined into a shell line)."""
        args: list[str] = []
        for name, value in self.to_dict().items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                # vLLM's boolean flags take --x / --no-x.
                args.append(flag if value else "--no-" + flag[2:])
            else:
                args += [flag, str(value)]
        return args

    def serve_command(self, model: str, extra: list[str] | None = None) -> str:
        """The exact `vllm serve` line a user runs to get this configuration."""
        return shlex.join(["vllm", "serve", model, *self.cli_args(), *(extra or [])])

    def merged(self, **changes: Any) -> EngineConfig:
        """This configuration with `changes` applied, checked again (TunerError for an unknown name or a bad value)."""
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        """The configuration from setting names and values, as `to_dict` gives, a search space proposes or YAML holds,
        each value coerced to its field's type; TunerError for an unknown setting or a bad value."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TunerError(f"unknown engine setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**{k: _coerce(k, v) for k, v in values.items()})

    @classmethod
    def from_assignments(cls, items: list[str]) -> EngineConfig:
        """Parse `name=value` strings as given on a command line (`--set max_num_seqs=8`)."""
        values: dict[str, Any] = {}
        for item in items:
            name, sep, raw = item.partition("=")
            if not sep or not name.strip():
                raise TunerError(f"expected NAME=VALUE, got {item!r}")
            values[name.strip().replace("-", "_")] = raw.strip()
        return cls.from_dict(values)


_FIELD_TYPES = {f.name: f.type for f in fields(EngineConfig)}


def _coerce(name: str, value: Any) -> Any:
    """Turn a command-line or YAML value into the field's type, with a clear error."""
    if value is None:
        return None
    kind = _FIELD_TYPES[name]
    try:
        if "bool" in kind:
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if "int" in kind:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if "float" in kind:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        expected = kind.split(" |")[0]
        raise TunerError(f"{name} expects {expected}, got {value!r}") from None
