"""What a proposal is judged against: the platform's support (PLATFORMS), and the trace, model and device of a
run (SpaceContext)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.common.errors import TunerError
from tuner.analysis.kv_budget import DeviceMemory, ModelMemory
from tuner.traces.transforms import FIT_MODES

if TYPE_CHECKING:
    from tuner.common.models import ModelInfo
    from tuner.traces.records import Trace


@dataclass(frozen=True)
class PlatformSupport:
    """What vLLM's build for one platform can run."""

    dtypes: tuple[str, ...]


# The one table of platform support: vLLM's CPU backend has no float16 path on these machines. FP8 depends on the
# device itself (HardwareInfo.fp8_unsupported) and on the study (SpaceContext.fp8_refused).
PLATFORMS = {
    "cuda": PlatformSupport(dtypes=("auto", "half", "float16", "bfloat16", "float", "float32")),
    "cpu": PlatformSupport(dtypes=("auto", "bfloat16", "float", "float32")),
}


NOT_ALLOWED = "the study does not allow FP8 (it changes the model's numerics: create it with --allow-fp8)"


@dataclass(frozen=True)
class SpaceContext:
    """What a proposal is judged against: the platform, the trace to replay, and the model."""

    platform: str  # "cpu" or "cuda"
    longest_request_tokens: int  # max input + output over the trace that will be replayed
    fit: str | None  # "clip" or "scale": the trace is fitted to max_model_len, so a short context is allowed
    model_max_len: int  # the model's max_position_embeddings
    # The model's sizes and the device's memory: with both, a proposal whose estimated KV cache cannot hold one
    # request of its max_model_len is refused before launch.
    model_memory: ModelMemory | None = None
    device: DeviceMemory | None = None
    # Why a proposal may not change the model's numerics (FP8 weights or KV cache): the study did not allow it, or
    # the machine cannot run it. None: it may.
    fp8_refused: str | None = NOT_ALLOWED

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise TunerError(f"platform must be one of {', '.join(PLATFORMS)}, got {self.platform!r}")
        if self.fit is not None and self.fit not in FIT_MODES:
            raise TunerError(f"fit must be one of {', '.join(FIT_MODES)} or unset, got {self.fit!r}")
        if self.longest_request_tokens < 0:
            raise TunerError(f"longest_request_tokens must be at least 0, got {self.longest_request_tokens}")
        if self.model_max_len < 1:
            raise TunerError(f"model_max_len must be at least 1, got {self.model_max_len}")

    @classmethod
    def for_run(cls, platform: str, model: ModelInfo, trace: Trace, fit: str | None,
                model_memory: ModelMemory | None = None, device: DeviceMemory | None = None,
                fp8_refused: str | None = NOT_ALLOWED) -> SpaceContext:
        """The context of replaying `trace` (as read, before any fitting) against `model` on `platform`."""
        longest = max((r.input_tokens + r.output_tokens for r in trace.requests), default=0)
        return cls(platform, longest, fit, model.max_position_embeddings, model_memory, device, fp8_refused)
