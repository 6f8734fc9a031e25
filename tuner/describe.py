"""How a recommendation is stated wherever it is printed or exported: with the boundary it meets, the machine
it was measured on, the vLLM version and the trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.hardware import HardwareInfo

if TYPE_CHECKING:
    from tuner.storage import StudySettings
    from tuner.scoring import Boundary
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


def throughput_line(completed_rps: float, e2e_p95_s: float) -> str:
    """A scored trial's completed throughput and p95 end-to-end latency, as every one-line trial summary
    (run progress, study status, schedule summaries) states them."""
    return f"{completed_rps:.3f} req/s, p95 e2e {e2e_p95_s:.2f} s"


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


def recommendation_dict(rec: Recommendation, settings: StudySettings) -> dict:
    """A recommendation for programs: the command, the boundary, the machine, vLLM, the trace, the gain."""
    t, base = rec.trial.to_dict(), rec.baseline.to_dict() if rec.baseline else None
    return {
        "study": settings.name, "trial": t["trial_number"], "serve_command": t["serve_command"],
        "engine_config": t["engine_config"], **recommendation_context(rec, settings),
        "score": t["score"],
        "measurement": {k: t["measurement"][k] for k in ("completed", "requests", "completed_rps", "output_tps",
                                                         "ttft_s", "e2e_s", "queue_s_p95", "preemptions")},
        "baseline": {"trial": base["trial_number"], "state": base["state"], "failure_class": base["failure_class"],
                     "score": base["score"]} if base else None,
        "gain": rec.gain,
    }
