"""The normalized trace: what every reader produces and every later step consumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

# Mooncake publishes prefix ids for blocks of this many tokens.
PREFIX_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRequest:
    """One recorded request: when it arrived and how long it was, in tokens."""

    arrival_s: float  # offset from the first request of the trace, seconds
    input_tokens: int
    output_tokens: int
    # Ids of PREFIX_BLOCK_TOKENS-token prompt blocks; equal ids are identical token blocks.
    prefix_blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Transformation:
    """A change applied to the trace as read, kept so that a result says what was replayed."""

    # "spread", "window", "rate_scale", "max_requests", "fit_clip", "fit_scale", "drop_failed", "repeat"
    kind: str
    params: dict[str, Any]
    affected: int  # requests dropped or changed by this step

    @property
    def label(self) -> str:
        """The step as a call, e.g. `window(start_s=0, end_s=60)`."""
        args = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind}({args})"

    def describe(self) -> str:
        """The step and how many requests it changed, e.g. `window(start_s=0, end_s=60): 12 requests affected`."""
        return f"{self.label}: {self.affected} requests affected"


@dataclass(frozen=True)
class TraceFit:
    """How a trace was fitted to one engine's context: how many of its requests had to be clipped or scaled."""

    mode: str  # "clip" or "scale"
    max_model_len: int
    requests: int
    fitted: int  # requests whose lengths changed

    @property
    def share(self) -> float:
        """The fitted requests' share of the trace (0 for no requests)."""
        return self.fitted / self.requests if self.requests else 0.0

    def describe(self) -> str:
        """E.g. `3 of 60 requests (5%) clipped to max_model_len 8192`."""
        verb = "clipped" if self.mode == "clip" else "scaled"
        return (f"{self.fitted} of {self.requests} requests ({self.share:.0%}) {verb} to max_model_len "
                f"{self.max_model_len}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as stored with the trial."""
        return asdict(self)


@dataclass(frozen=True)
class Trace:
    """A recorded request trace, normalized, with its origin and every transformation applied."""

    source: str  # path as given
    format: str  # "azure", "mooncake", "burstgpt", "native"
    sha256: str  # of the file's bytes, so a study can tell which trace it ran
    requests: tuple[TraceRequest, ...]
    transformations: tuple[Transformation, ...] = field(default_factory=tuple)

    @property
    def span_s(self) -> float:
        """Seconds from the first arrival to the last (0 without requests)."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    @property
    def rate_rps(self) -> float:
        """Requests per second over the span (requests / span); 0 when the span is 0."""
        span = self.span_s
        return len(self.requests) / span if span > 0 else 0.0

    @property
    def fit(self) -> TraceFit | None:
        """How the trace was last fitted to a context; None when it was replayed at its recorded lengths."""
        steps = [t for t in self.transformations if t.kind in ("fit_clip", "fit_scale")]
        if not steps:
            return None
        step = steps[-1]
        return TraceFit(step.params["mode"], step.params["max_model_len"], len(self.requests), step.affected)

    @property
    def whole_share(self) -> float:
        """The share of its requests served as asked: 1 less the share its last fit clipped. A clipped prompt
        stands for one vLLM would refuse; a scaled trace is another workload, chosen whole (every request shrunk
        by one factor to fit a smaller model's context), so it refuses none."""
        fit = self.fit
        return 1.0 - fit.share if fit is not None and fit.mode == "clip" else 1.0

    def with_step(self, requests: tuple[TraceRequest, ...], step: Transformation) -> Trace:
        """A copy holding `requests` instead, with `step` added to its transformations."""
        return replace(self, requests=requests, transformations=self.transformations + (step,))
