"""How a recommendation is stated wherever it is printed or exported: with the boundary it meets, the machine
it was measured on, the vLLM version and the trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.diagnosis import EngineCaps, LimitingResource, limiting_resource
from tuner.hardware import HardwareInfo

if TYPE_CHECKING:
    from tuner.storage import StoredTrial, StudySettings
    from tuner.scoring import Boundary, Capacity
    from tuner.study.recommendation import Recommendation


def hardware_line(hw: HardwareInfo | None) -> str:
    """GPU model, memory and count, or CPU model and cores."""
    return hw.describe() if hw else "unknown"


def boundary_line(b: Boundary) -> str:
    """The boundary's name with every limit it sets."""
    parts = []
    if b.ttft_p95_s is not None:
        parts.append(f"p95 TTFT <= {b.ttft_p95_s:g} s")
    if b.e2e_p95_s is not None:
        parts.append(f"p95 e2e <= {b.e2e_p95_s:g} s")
    parts.append(f"completion >= {b.min_completion_ratio:.0%}")
    if b.makespan_factor is not None:
        parts.append(f"makespan <= {b.makespan_factor:g} x span + {b.makespan_grace_s:g} s")
    return f"{b.name} ({', '.join(parts)})"


def capacity_line(capacity: Capacity) -> str | None:
    """The load a capacity stands for, `3.4 req/s (x1.7 the trace's rate)`; None when no probe passed."""
    if capacity.rps is None:
        return None
    scale = f" (x{capacity.rate_scale:.3g} the trace's rate)" if capacity.rate_scale is not None else ""
    return f"{capacity.rps:.3g} req/s{scale}"


def trial_limit(t: StoredTrial, bound: Boundary) -> LimitingResource | None:
    """What holds a stored trial back: at its edge probe after a load search, else at its one measurement; None
    when it measured nothing."""
    return limiting_resource(t.probes, t.measurement, EngineCaps.of(t.engine_config.to_dict(), t.hardware),
                             ttft_limit_s=bound.ttft_p95_s)


def throughput_line(completed_rps: float, e2e_p95_s: float, capacity_rps: float | None = None,
                    searched: bool = False) -> str:
    """A scored trial's completed throughput (after a load search, its capacity) and p95 end-to-end latency at the
    reference load, as every one-line trial summary (run progress, study status, schedule summaries) states
    them."""
    if not searched:
        return f"{completed_rps:.3f} req/s, p95 e2e {e2e_p95_s:.2f} s"
    carried = f"capacity {capacity_rps:.3g} req/s" if capacity_rps is not None else "no load within the boundary"
    return f"{carried}, p95 e2e {e2e_p95_s:.2f} s at your traffic"


def recommendation_context(rec: Recommendation, settings: StudySettings) -> dict:
    """What every stated recommendation carries: its boundary, the machine, vLLM and the trace."""
    t = rec.trial
    return {"boundary": rec.boundary.to_dict(), "boundary_text": boundary_line(rec.boundary),
            "hardware": t.to_dict()["hardware"], "measured_on": hardware_line(t.hardware),
            "vllm_version": t.vllm_version,
            "trace": {"path": settings.trace_path, "sha256": settings.trace_sha256,
                      "selection": settings.trace_selection.to_dict()}}


def context_line(context: dict) -> str:
    """recommendation_context in words."""
    trace = context["trace"]
    return (f"meets the {context['boundary_text']} boundary; measured on {context['measured_on']}, vLLM "
            f"{context['vllm_version']}, trace {trace['path']} (sha256 {trace['sha256'][:12]})")


def baseline_dict(base: StoredTrial) -> dict:
    """vLLM's default configuration as a study ran it, for programs: its trial, how it ended, its failure class
    and its score as stored."""
    return {"trial": base.trial_number, "state": base.state.value, "failure_class": base.failure_class,
            "score": base.score.to_dict() if base.score else {}}


def _measurement_summary(measurement: dict) -> dict:
    """A recommendation's measurement in brief; the offered load only where it was measured (since load probes),
    so that older answers keep their shape."""
    keys = ("completed", "requests", "completed_rps", "output_tps", "ttft_s", "e2e_s", "queue_s_p95", "preemptions")
    summary = {k: measurement[k] for k in keys}
    if measurement.get("offered_rps") is not None:
        summary["offered_rps"] = measurement["offered_rps"]
    return summary


def recommendation_dict(rec: Recommendation, settings: StudySettings) -> dict:
    """A recommendation for programs: the command, the boundary, the machine, vLLM, the trace, and the validation
    that states its gain over vLLM's default with an interval (None: not validated)."""
    t = rec.trial.to_dict()
    return {
        "study": settings.name, "trial": t["trial_number"], "serve_command": t["serve_command"],
        "engine_config": t["engine_config"], **recommendation_context(rec, settings),
        "score": t["score"],
        "measurement": _measurement_summary(t["measurement"]),
        "baseline": baseline_dict(rec.baseline) if rec.baseline else None,
        "validation": rec.validation.to_dict() if rec.validation else None,
    }
