"""What the report says, as typed rows and sentences: every trial, the default beside the recommendation, the
machines measured on, the recommendation in words, and `summary`, the same content as JSON.

The terminal, the JSON answer and the HTML page all show these; none of them computes a figure of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tuner.analysis.capacity import JudgedProbe
from tuner.describe import boundary_line, hardware_line, own_dtype, recommendation_dict
from tuner.analysis.diagnosis import LimitingResource
from tuner.report.data import ReportData
from tuner.analysis.scoring import Capacity, capacity_line
from tuner.storage import StoredTrial, StudySettings, TrialState
from tuner.storage.spend import GpuTime
from tuner.traces.records import TraceFit
from tuner.study.recommendation import as_sentence, capacity_sentence, trial_limit
from tuner.workers.measure import Measurement

DEFAULT_LABEL = "vLLM default"


def number_text(value: Any, digits: int = 3, unit: str = "") -> str:
    """A figure as the tables print it: "-" for none, yes/no for a flag, `digits` decimals for a float."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _measured(t: StoredTrial | None, read: Callable[[Measurement], Any]) -> Any:
    """One figure of a trial's measurement; None for no trial, or one that measured nothing."""
    return read(t.measurement) if t is not None and t.measurement is not None else None


def _why(t: StoredTrial) -> str:
    violations = t.score.violations if t.score else []
    if t.state is TrialState.INFEASIBLE:
        return "rejected before launch: " + "; ".join(violations)
    if t.state is TrialState.PRUNED:
        return f"pruned: {t.prune_reason}" if t.prune_reason else "pruned"
    if t.failure_class:
        message = (t.failure_message or "").strip().splitlines()
        return message[0][:200] if message else ""
    reasons = ["outside the boundary: " + "; ".join(violations)] if violations else []
    unreported = t.measurement.metrics_unreported if t.measurement else None
    if unreported:  # what a renamed metric reads as, said beside the figures it hides in
        reasons.append(f"vLLM did not report {', '.join(unreported)}: read as 0")
    return "; ".join(reasons)


def common_settings(data: ReportData) -> dict[str, Any]:
    """The engine settings every trial shared (the space's fixed values, as a rule)."""
    if not data.trials:
        return {}
    configs = [t.engine_config.to_dict() for t in data.trials]
    return {k: v for k, v in configs[0].items() if all(c.get(k, object()) == v for c in configs)}


@dataclass(frozen=True)
class TrialRow:
    """One trial as the report lists it: its failure class, the figures it was judged on, its roles in the
    study, and why it failed or fell outside the boundary. The figures are None for a trial that measured
    nothing; `feasible` is None for a trial that was not scored."""

    trial: int
    attempt: int
    roles: list[str]  # "default", "recommended", "Pareto"
    state: TrialState
    failure_class: str | None
    config: dict[str, Any]
    settings: dict[str, Any]  # what sets the trial apart: its configuration less the settings all trials share
    completed: int | None
    requests: int | None
    completed_rps: float | None
    ttft_p95_s: float | None
    e2e_p95_s: float | None
    queue_s_mean: float | None
    inference_s_mean: float | None
    preemptions: int | None
    kv_tokens: int | None
    feasible: bool | None
    why: str
    # In a study with a load search: the highest load that passed and each load probed, with its verdict. None
    # in a study at a fixed load, whose rows read as they did before probes came.
    capacity: Capacity | None = None
    probes: list[JudgedProbe] | None = None
    # What holds it back, at the load where it stops meeting the boundary; None for a trial that measured nothing.
    limiting_resource: LimitingResource | None = None
    trace_fit: TraceFit | None = None  # how many requests its max_model_len clipped or scaled; None: unfitted
    gpu_time: GpuTime = GpuTime()  # its own slot time by part (none for a proposal refused before launch)

    @property
    def label(self) -> str:
        """The trial's number, with its attempt after the first: `3 (attempt 2)`."""
        return str(self.trial) + (f" (attempt {self.attempt})" if self.attempt > 1 else "")

    @property
    def capacity_cells(self) -> tuple[str, str, str]:
        """The capacity as the table prints it: req/s, times the trace's recorded rate, and how the search
        ended with how many probes; "-" where there is none."""
        c = self.capacity
        if c is None:
            return "-", "-", "-"
        rate = f"x{c.rate_scale:.3g}" if c.rate_scale is not None else "-"
        return number_text(c.rps), rate, f"{c.probes} probe{'s' if c.probes != 1 else ''}: {c.ended}"

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data, keys in field order; `capacity` and `probes` (each with its verdict and
        reasons) only in a study with a load search."""
        data = {**asdict(self), "state": self.state.value}
        if self.probes is None:
            del data["capacity"], data["probes"]
        else:
            data.update(capacity=self.capacity.to_dict() if self.capacity else None,
                        probes=[p.to_dict() for p in self.probes])
        data["limiting_resource"] = self.limiting_resource.to_dict() if self.limiting_resource else None
        data["gpu_time"] = self.gpu_time.to_dict()
        return data


def trial_rows(data: ReportData) -> list[TrialRow]:
    """Every trial, in the study's order."""
    shared = common_settings(data)
    searched = data.searched
    rows = []
    for t in data.trials:
        config = t.engine_config.to_dict()
        rows.append(TrialRow(
            trial=t.trial_number, attempt=t.attempt, roles=data.roles(t), state=t.state,
            failure_class=t.failure_class, config=config,
            settings={k: v for k, v in config.items() if k not in shared},
            completed=_measured(t, lambda m: m.completed), requests=_measured(t, lambda m: m.requests),
            completed_rps=_measured(t, lambda m: m.completed_rps), ttft_p95_s=_measured(t, lambda m: m.ttft_s.p95),
            e2e_p95_s=_measured(t, lambda m: m.e2e_s.p95), queue_s_mean=_measured(t, lambda m: m.queue_s_mean),
            inference_s_mean=_measured(t, lambda m: m.inference_s_mean),
            preemptions=_measured(t, lambda m: m.preemptions), kv_tokens=data.kv_tokens.get(t.trial_number),
            feasible=t.score.feasible if t.state is TrialState.COMPLETE and t.score else None, why=_why(t),
            capacity=data.capacity(t) if searched else None, probes=list(t.probes) if searched else None,
            limiting_resource=trial_limit(t, data.boundary), trace_fit=t.trace_fit, gpu_time=GpuTime.of_trial(t)))
    return rows


class SideBySideRow(NamedTuple):
    """One line of the default-beside-recommendation table, every cell as printed."""

    what: str
    default: str
    recommended: str
    change: str


def _ratio_text(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return ""
    if a == 0:
        return "" if b == 0 else "from 0"
    return f"{(b - a) / a * 100:+.0f}%"


def _capacity_text(capacity: Capacity | None) -> str:
    """A trial's capacity as a cell: `21 req/s (x5.89 the trace's rate)`, "none" when no load passed, "-" without
    a search."""
    if capacity is None:
        return "-"
    return capacity_line(capacity) or "none"


def _queue_share(m: Measurement) -> float | None:
    """The share of a request's time in vLLM spent waiting to be scheduled (mean queue time over mean queue plus
    inference time); None where vLLM gave either figure no value."""
    if m.queue_s_mean is None or m.inference_s_mean is None or m.queue_s_mean + m.inference_s_mean <= 0:
        return None
    return m.queue_s_mean / (m.queue_s_mean + m.inference_s_mean)


def _meets(t: StoredTrial | None) -> str:
    if t is None:
        return "-"
    if t.scored is None:
        return f"not scored ({t.failure_class or t.state})"
    return "yes" if t.scored.feasible else "no: " + "; ".join(t.scored.violations)


def side_by_side(data: ReportData) -> list[SideBySideRow]:
    """vLLM's default and the recommendation, row by row: settings first, then what was measured."""
    base, rec = data.baseline, data.recommended
    rows = [SideBySideRow("trial", number_text(base.trial_number) if base else "not run",
                          number_text(rec.trial_number) if rec else "none", "")]
    base_config = base.engine_config.to_dict() if base else {}
    rec_config = rec.engine_config.to_dict() if rec else {}
    for key in dict.fromkeys([*base_config, *rec_config]):
        a = base_config.get(key, DEFAULT_LABEL) if base else "-"
        b = rec_config.get(key, DEFAULT_LABEL) if rec else "-"
        rows.append(SideBySideRow(key, str(a), str(b), "" if a == b else "changed"))
    rows.append(SideBySideRow("state", base.state + (f" ({base.failure_class})" if base and base.failure_class else "")
                              if base else "-", rec.state if rec else "-", ""))

    def metric(label: str, read: Callable[[Measurement], Any], digits: int = 3, unit: str = "",
               ratio: bool = True) -> None:
        a, b = _measured(base, read), _measured(rec, read)
        shown = number_text(a, digits, unit), number_text(b, digits, unit)
        # No change between two values that read the same: 0.000 s against 0.000 s is no +546%.
        rows.append(SideBySideRow(label, *shown, _ratio_text(a, b) if ratio and shown[0] != shown[1] else ""))

    def share(label: str, read: Callable[[Measurement], float | None]) -> None:
        a, b = _measured(base, read), _measured(rec, read)
        rows.append(SideBySideRow(label, f"{a:.0%}" if a is not None else "-", f"{b:.0%}" if b is not None else "-",
                                  ""))

    def completed(t: StoredTrial | None) -> str:
        return f"{t.measurement.completed}/{t.measurement.requests}" if t and t.measurement else "-"

    if data.searched:
        ca, cb = (data.capacity(t) if t is not None else None for t in (base, rec))
        rows.append(SideBySideRow("capacity within the boundary", _capacity_text(ca), _capacity_text(cb),
                                  _ratio_text(ca.rps if ca else None, cb.rps if cb else None)))
        wa, wb = (t.scored.whole_share if t is not None and t.scored is not None else 1.0 for t in (base, rec))
        if min(wa, wb) < 1:  # a max_model_len that clips: the traffic carried whole is what the study ranked
            whole = [c.rps * w if c is not None and c.rps is not None else None for c, w in ((ca, wa), (cb, wb))]
            rows.append(SideBySideRow(f"of it carried whole (clipped: {1 - wa:.0%} / {1 - wb:.0%})",
                                      *(f"{w:.3g} req/s" if w is not None else "-" for w in whole),
                                      _ratio_text(*whole)))
    rows.append(SideBySideRow("completed / requests", completed(base), completed(rec), ""))
    metric("completed req/s", lambda m: m.completed_rps)
    metric("output tok/s", lambda m: m.output_tps, 1)
    metric("p95 TTFT", lambda m: m.ttft_s.p95, 3, " s")
    metric("p95 end-to-end", lambda m: m.e2e_s.p95, 3, " s")
    metric("mean queue time (vLLM)", lambda m: m.queue_s_mean, 3, " s")
    metric("mean inference time (vLLM)", lambda m: m.inference_s_mean, 3, " s")
    share("queue's share of latency (vLLM)", _queue_share)
    pa, pb = _measured(base, lambda m: m.preemptions), _measured(rec, lambda m: m.preemptions)
    rows.append(SideBySideRow("preemptions", number_text(pa), number_text(pb),
                              "" if pa == pb or None in (pa, pb) else f"{pa} → {pb}"))
    metric("preemptions per 100 requests", lambda m: m.preemptions_per_100, 1, ratio=False)
    share("prefix-cache hit rate", lambda m: m.prefix_cache_hit_rate)
    metric("running peak", lambda m: m.running_peak, 0, ratio=False)
    metric("waiting peak", lambda m: m.waiting_peak, 0, ratio=False)
    share("KV usage peak", lambda m: m.kv_usage_peak)
    ta = data.kv_tokens.get(base.trial_number) if base else None
    tb = data.kv_tokens.get(rec.trial_number) if rec else None
    rows.append(SideBySideRow("KV budget (tokens)", number_text(ta), number_text(tb),
                              _ratio_text(ta, tb) if ta != tb else ""))
    rows.append(SideBySideRow(f"meets the {data.boundary.name} boundary", _meets(base), _meets(rec), ""))
    return rows


@dataclass(frozen=True)
class MachineGroup:
    """One machine and vLLM version the study measured on, and the trials measured there."""

    hardware: str  # as tuner.describe.hardware_line writes it
    vllm_version: str
    trials: list[int]

    def to_dict(self) -> dict[str, Any]:
        """The group as JSON-ready data."""
        return asdict(self)


def measured_on(data: ReportData) -> list[MachineGroup]:
    """Each distinct machine and vLLM version the study's trials were measured on, in the trials' order."""
    groups: dict[tuple[str, str], list[int]] = {}
    for t in data.trials:
        if t.hardware and t.state is not TrialState.INFEASIBLE:
            groups.setdefault((hardware_line(t.hardware), t.vllm_version), []).append(t.trial_number)
    return [MachineGroup(hw, version, numbers) for (hw, version), numbers in groups.items()]


def trace_line(settings: StudySettings, requests: int | None = None) -> str:
    """The trace as one line: its file name, the start of its sha256, the request count if given, the selection."""
    selection = ", ".join(f"{k}={v}" for k, v in settings.trace_selection.to_dict().items()
                          if v is not None and v is not False) or "as recorded"
    count = f", {requests} requests" if requests is not None else ""
    return f"{Path(settings.trace_path).name} (sha256 {settings.trace_sha256[:12]}{count}; {selection})"


def trial_count_line(data: ReportData) -> str:
    """How many trials ended in each state: `6 trials: 4 complete, 2 failed`."""
    counts = Counter(t.state for t in data.trials)
    return f"{len(data.trials)} trials: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def recommendation_lines(data: ReportData) -> list[str]:
    """The recommendation as sentences: what, under which boundary, on which machine, trace and vLLM.
    With a recommendation, the first line is the headline and the second the `vllm serve` command."""
    rec, settings = data.recommendation, data.settings
    if rec is None:
        machines = "; ".join(f"{m.hardware}, vLLM {m.vllm_version}" for m in measured_on(data)) or "no machine"
        return [f"No trial met the {boundary_line(data.boundary)} boundary yet.",
                f"Trials measured on {machines}, trace {trace_line(settings)}.", spent_line(data)]
    t, m = rec.trial, rec.trial.measurement
    lines = [f"Recommended for the {boundary_line(rec.boundary)} boundary: trial {t.trial_number}.",
             t.serve_command,
             f"Measured on {hardware_line(t.hardware)}, vLLM {t.vllm_version}, trace "
             f"{trace_line(settings, m.requests)}.",
             f"Completed {m.completed}/{m.requests} at {t.scored.completed_rps:.3f} req/s, "
             f"p95 TTFT {number_text(m.ttft_s.p95)} s, p95 end-to-end {t.scored.e2e_p95_s:.3f} s, "
             f"{m.preemptions} preemptions."]
    # After a load search, what each carries within the boundary: the objective the study ranked them by.
    if t.scored.capacity is not None:  # as the search found it; the validation's launches follow the verdict
        subject = "In the search, it" if rec.validation is not None else "It"
        lines.append(f"{subject} {capacity_sentence(t.scored, m.offered_rps)}.")
    shortfall = rec.shortfall()
    if shortfall:
        lines.append(as_sentence(shortfall))
    default = rec.baseline
    base = default.scored if default is not None and default.trial_number != t.trial_number else None
    if default is not None and base is not None and base.capacity is not None:
        lines.append(f"vLLM's default configuration (trial {default.trial_number}) "
                     f"{capacity_sentence(base, m.offered_rps)}.")
    numerics = rec.numerics_sentence(own_dtype(settings))
    if numerics:
        lines.insert(2, as_sentence(numerics))
    lines.append(rec.gain_sentence(report=True))
    if rec.validation is not None:
        lines.append(as_sentence(rec.validation.launches_text()))
    own = rec.own_precision
    if own is not None:
        carried = (f": it {capacity_sentence(own.scored, m.offered_rps)}"
                   if own.scored is not None and own.scored.capacity is not None else "")
        lines.append(f"At the model's own precision the best is trial {own.trial_number} ({own.serve_command})"
                     f"{carried}; {rec.own_precision_gain()}.")
    lines.append(spent_line(data))
    return lines


def spent_line(data: ReportData) -> str:
    """What finding the answer out cost: `Spent GPU time 12m30s: startup ..., idle 30s; 5 launches, 2 cold starts,
    3 warm.`"""
    return f"Spent {data.spent.text()}."


def summary(data: ReportData) -> dict[str, Any]:
    """The report's content as JSON-ready data: what `--json` prints and the service answers."""
    return {
        "study": data.settings.name, "generated_at": data.generated_at, "model": data.settings.model,
        "boundary": data.boundary.to_dict(), "boundary_text": boundary_line(data.boundary),
        "trace": {"path": data.settings.trace_path, "sha256": data.settings.trace_sha256,
                  "selection": data.settings.trace_selection.to_dict()},
        "measured_on": [m.to_dict() for m in measured_on(data)],
        "recommendation": recommendation_dict(data.recommendation, data.settings) if data.recommendation else None,
        "recommendation_text": recommendation_lines(data),
        "default_trial": data.baseline.trial_number if data.baseline else None,
        "side_by_side": [row._asdict() for row in side_by_side(data)],
        "common_settings": common_settings(data), "trials": [row.to_dict() for row in trial_rows(data)],
        "pareto": sorted(data.pareto), "timelines": sorted(data.timelines), "spent": data.spent.to_dict(),
    }
