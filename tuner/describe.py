"""How a recommendation is stated wherever it is printed or exported: with the boundary it meets, the machine
it was measured on, the vLLM version and the trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tuner.common.hardware import HardwareInfo
from tuner.analysis.scoring import Boundary
from tuner.traces.selection import TraceSelection

if TYPE_CHECKING:
    from tuner.storage import StoredTrial, StudySettings
    from tuner.workers.measure import Measurement
    from tuner.study.recommendation import Recommendation


def hardware_line(hw: HardwareInfo | None) -> str:
    """GPU model, memory and count, or CPU model and cores."""
    return hw.describe() if hw else "unknown"


def boundary_line(b: Boundary) -> str:
    """The boundary's name with every limit it sets."""
    parts = []
    if b.ttft_p95_s is not None:
        parts.append(f"p95 TTFT <= {b.ttft_p95_s:g} s")
    if b.ttft_per_1k_prompt_p95_s is not None:
        parts.append(f"p95 TTFT <= {b.ttft_per_1k_prompt_p95_s:g} s per 1,000 prompt tokens")
    if b.e2e_p95_s is not None:
        parts.append(f"p95 e2e <= {b.e2e_p95_s:g} s")
    if b.tpot_p95_s is not None:
        parts.append(f"p95 TPOT <= {b.tpot_p95_s:g} s")
    parts.append(f"completion >= {b.min_completion_ratio:.0%}")
    if b.makespan_factor is not None:
        parts.append(f"makespan <= {b.makespan_factor:g} x span + {b.makespan_grace_s:g} s")
    return f"{b.name} ({', '.join(parts)})"


def throughput_line(completed_rps: float, e2e_p95_s: float, capacity_rps: float | None = None,
                    searched: bool = False) -> str:
    """A scored trial's completed throughput (after a load search, its capacity) and p95 end-to-end latency at the
    reference load, as every one-line trial summary (run progress, study status, schedule summaries) states
    them."""
    if not searched:
        return f"{completed_rps:.3f} req/s, p95 e2e {e2e_p95_s:.2f} s"
    carried = f"capacity {capacity_rps:.3g} req/s" if capacity_rps is not None else "no load within the boundary"
    return f"{carried}, p95 e2e {e2e_p95_s:.2f} s at your traffic"


@dataclass(frozen=True)
class RecommendationContext:
    """What every stated recommendation carries: the boundary it meets, the machine it was measured on, the vLLM
    version and the trace (its path, the sha256 of its bytes and the selection replayed)."""

    boundary: Boundary
    hardware: HardwareInfo | None  # None: the trial recorded no machine
    vllm_version: str
    trace_path: str
    trace_sha256: str
    selection: TraceSelection

    @classmethod
    def of(cls, rec: Recommendation, settings: StudySettings) -> RecommendationContext:
        """The context of a study's recommendation."""
        t = rec.trial
        return cls(rec.boundary, t.hardware, t.vllm_version, settings.trace_path, settings.trace_sha256,
                   settings.trace_selection)

    def to_dict(self) -> dict[str, Any]:
        """As answers and the morning summary state it (the service's `StatedContext`): the boundary and the
        machine in words beside their figures."""
        return {"boundary": self.boundary.to_dict(), "boundary_text": boundary_line(self.boundary),
                "hardware": self.hardware.to_dict() if self.hardware else {},
                "measured_on": hardware_line(self.hardware), "vllm_version": self.vllm_version,
                "trace": {"path": self.trace_path, "sha256": self.trace_sha256,
                          "selection": self.selection.to_dict()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecommendationContext:
        """The context `to_dict` gave (the words are made again from the figures)."""
        trace = data["trace"]
        return cls(Boundary(**data["boundary"]), HardwareInfo.from_dict(data["hardware"]) if data["hardware"] else None,
                   data["vllm_version"], trace["path"], trace["sha256"], TraceSelection.from_dict(trace["selection"]))

    def line(self, meets: bool = True) -> str:
        """The context in words (`context_line`)."""
        return context_line(boundary_line(self.boundary), hardware_line(self.hardware), self.vllm_version,
                            self.trace_path, self.trace_sha256, meets)


def context_line(boundary_text: str, measured_on: str, vllm_version: str, trace_path: str, trace_sha256: str,
                 meets: bool = True) -> str:
    """Where a recommendation holds, in words: the boundary it meets at your traffic (or, `meets` False, falls
    short of there), the machine, vLLM and the trace."""
    within = "meets" if meets else "falls short at your traffic of"
    return (f"{within} the {boundary_text} boundary; measured on {measured_on}, vLLM {vllm_version}, trace "
            f"{trace_path} (sha256 {trace_sha256[:12]})")


def baseline_dict(base: StoredTrial) -> dict:
    """vLLM's default configuration as a study ran it, for programs: its trial, how it ended, its failure class
    and its score as stored."""
    return {"trial": base.trial_number, "state": base.state.value, "failure_class": base.failure_class,
            "score": base.score.to_dict() if base.score else {}}


def _measurement_summary(m: Measurement) -> dict[str, Any]:
    """A recommendation's measurement in brief; the offered load only where it was measured (since load probes),
    so that older answers keep their shape."""
    summary = {"completed": m.completed, "requests": m.requests, "completed_rps": m.completed_rps,
               "output_tps": m.output_tps, "ttft_s": asdict(m.ttft_s), "e2e_s": asdict(m.e2e_s),
               "queue_s_p95": m.queue_s_p95, "preemptions": m.preemptions}
    if m.offered_rps is not None:
        summary["offered_rps"] = m.offered_rps
    return summary


def recommendation_dict(rec: Recommendation, settings: StudySettings) -> dict[str, Any]:
    """A recommendation for programs: the command, the boundary, the machine, vLLM, the trace, and the validation
    that states its gain over vLLM's default with an interval (None: not validated)."""
    t = rec.trial
    return {
        "study": settings.name, "trial": t.trial_number, "serve_command": t.serve_command,
        "engine_config": t.engine_config.to_dict(), **RecommendationContext.of(rec, settings).to_dict(),
        "score": t.score.to_dict() if t.score else {}, "shortfall": rec.shortfall(),
        "measurement": _measurement_summary(t.measurement) if t.measurement else None,
        "baseline": baseline_dict(rec.baseline) if rec.baseline else None,
        "validation": rec.validation.to_dict() if rec.validation else None,
        "changes_numerics": t.engine_config.changes_numerics,
        "numerics": rec.numerics_sentence(own_dtype(settings)),
        "own_precision": _own_precision_dict(rec) if rec.own_precision else None,
    }


def own_dtype(settings: StudySettings) -> str:
    """The model's own precision as its config names it (bfloat16...), or in words for a study stored without."""
    memory = settings.model_info.memory
    return memory.dtype if memory is not None else "the model's own precision"


def _own_precision_dict(rec: Recommendation) -> dict[str, Any]:
    """The best configuration at the model's own precision, beside a recommendation that changes its numerics: its
    trial, command, settings, score as stored and its validated gain over vLLM's default (or why there is none)."""
    own = rec.own_precision
    assert own is not None
    return {"trial": own.trial_number, "serve_command": own.serve_command, "engine_config": own.engine_config.to_dict(),
            "score": own.score.to_dict() if own.score else {}, "gain": rec.own_precision_gain()}
