"""The study report: one self-contained HTML page people read, and the same summary for the terminal.

What is on it: the Pareto front of completed throughput against p95 end-to-end latency with the boundary
drawn; vLLM's default configuration and the recommendation side by side; every trial with its failure
class; preemptions against max_num_seqs and the KV budget; where the time went (vLLM's queue and inference
histograms); the running, waiting and KV-usage timelines of the default and the recommended trial; requested
against served output lengths. Every recommendation is stated with the boundary it meets, the machine it was
measured on, the trace and the vLLM version.

The page embeds plotly.js: it opens without a network.
"""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner.storage import StoredTrial, StudyModel, StudySettings, TrialState
from tuner.scoring import Boundary, boundary
from tuner.study.recommendation import Recommendation
from tuner.describe import boundary_line, hardware_line, recommendation_dict
from tuner.kv_budget import logged_kv_tokens
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement
from tuner.workers.replay import RequestRecord
from tuner.workers.server_metrics import TimelineSample

TIMELINE_FILE = "timeline.csv"  # t_s,running,waiting,kv_usage, sampled every 0.25 s during the replay
NO_TIMELINE = "no timeline recorded"
DEFAULT_LABEL = "vLLM default"

COLORS = {"default": "#1f77b4", "recommended": "#d62728", "queue": "#ff7f0e", "inference": "#1f77b4",
          "feasible": "#2ca02c", "other": "#9e9e9e", "front": "#ff7f0e", "dominated": "#17becf"}


def trial_dir(artifact_dir: Path, study: str, number: int) -> Path:
    """Where a study's trial keeps its files (as tuner.study.StudyRunner writes them)."""
    return Path(artifact_dir) / "trials" / study / f"trial-{number:04d}"


def read_timeline(path: Path) -> list[TimelineSample] | None:
    """A trial's sampled timeline (t_s, running, waiting, kv_usage), or None when none was recorded."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    try:
        samples = [TimelineSample(float(r["t_s"]), float(r["running"]), float(r["waiting"]), float(r["kv_usage"]))
                   for r in rows]
    except (KeyError, TypeError, ValueError):
        return None  # a file this report cannot read is shown as no timeline, not as a crash
    return samples or None


def kv_budget_tokens(trial: StoredTrial, model_info: StudyModel, log_path: Path | None = None) -> int | None:
    """Tokens the KV cache held: as vLLM logged it at startup, else as far as the configuration says."""
    if log_path is not None:
        try:
            logged = logged_kv_tokens(log_path.read_text(errors="replace"))
        except OSError:
            logged = None
        if logged is not None:
            return logged
    config = trial.engine_config
    if config.num_gpu_blocks_override and config.block_size:
        return config.num_gpu_blocks_override * config.block_size
    per_token = model_info.kv_bytes_per_token
    if config.kv_cache_memory_bytes and per_token and not config.num_gpu_blocks_override:
        return config.kv_cache_memory_bytes // per_token
    return None


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows, read once from the study's storage (or built by hand in tests)."""

    settings: StudySettings
    boundary: Boundary
    trials: tuple[StoredTrial, ...]
    recommendation: Recommendation | None
    baseline: StoredTrial | None  # vLLM's default configuration, as run first
    requests: dict[int, list[RequestRecord]] = field(default_factory=dict)
    timelines: dict[int, list[TimelineSample]] = field(default_factory=dict)  # only the trials that have one
    kv_tokens: dict[int, int] = field(default_factory=dict)
    generated_at: str = ""

    def trial(self, number: int | None) -> StoredTrial | None:
        return next((t for t in self.trials if t.trial_number == number), None)

    @property
    def recommended(self) -> StoredTrial | None:
        return self.recommendation.trial if self.recommendation else None

    @property
    def measured(self) -> list[StoredTrial]:
        """Trials with a measurement (complete, pruned, or an engine that died mid-replay)."""
        return [t for t in self.trials if t.measurement]

    @property
    def scored(self) -> list[StoredTrial]:
        """Trials that served and were scored, feasible or not."""
        return [t for t in self.trials if t.scored is not None]

    @property
    def featured(self) -> list[tuple[str, StoredTrial]]:
        """The default and the recommended trial, once each when they are the same trial."""
        base, rec = self.baseline, self.recommended
        if base is not None and rec is not None and base.trial_number == rec.trial_number:
            return [("default and recommended", base)]
        return [(role, t) for role, t in (("default", base), ("recommended", rec)) if t is not None]

    def roles(self, t: StoredTrial) -> list[str]:
        roles = []
        if self.baseline is not None and t.trial_number == self.baseline.trial_number:
            roles.append("default")
        if self.recommended is not None and t.trial_number == self.recommended.trial_number:
            roles.append("recommended")
        if t.trial_number in self.pareto:
            roles.append("Pareto")
        return roles

    @cached_property
    def pareto(self) -> frozenset[int]:
        """Numbers of the trials on the Pareto front (feasible ones only), as Optuna computes it."""
        return frozenset(pareto_numbers(self))


def collect_report(name: str, plan) -> ReportData:
    """Read a study back: its trials, recommendation, default, request rows, timelines and KV budgets."""
    from tuner.study.plan import load_optuna_study
    from tuner.study.recommendation import find_baseline, recommend

    repo = plan.repository()
    settings = repo.get_study(name)
    study = load_optuna_study(name, plan)
    trials = tuple(repo.trials(name))
    rec = recommend(repo, settings, study)
    baseline = rec.baseline if rec is not None else find_baseline(list(trials), study)
    requests, timelines, kv = {}, {}, {}
    for t in trials:
        folder = trial_dir(plan.artifact_dir, name, t.trial_number)
        if t.measurement:
            requests[t.trial_number] = repo.requests(name, t.trial_number)
            timeline = read_timeline(folder / TIMELINE_FILE)
            if timeline:
                timelines[t.trial_number] = timeline
        tokens = kv_budget_tokens(t, settings.model_info, folder / "server.log")
        if tokens is not None:
            kv[t.trial_number] = tokens
    return ReportData(settings, boundary(settings.boundary, settings.limits), trials, rec, baseline, requests,
                      timelines, kv, datetime.now(timezone.utc).isoformat(timespec="seconds"))


# --- figures of one trial, as numbers -----------------------------------------------------------------


def _figure(t: StoredTrial | None, read: Callable[[Measurement], Any]) -> Any:
    """One figure of a trial's measurement; None for no trial, or one that measured nothing."""
    return read(t.measurement) if t is not None and t.measurement is not None else None


def _mean_e2e(requests: list[RequestRecord]) -> float | None:
    values = [r.e2e_s for r in requests if r.e2e_s is not None]
    return sum(values) / len(values) if values else None


def _why(t: StoredTrial) -> str:
    violations = t.score.violations if t.score else []
    if t.state is TrialState.INFEASIBLE:
        return "rejected before launch: " + "; ".join(violations)
    if t.state is TrialState.PRUNED:
        return f"pruned: {t.prune_reason}" if t.prune_reason else "pruned"
    if t.failure_class:
        message = (t.failure_message or "").strip().splitlines()
        return message[0][:200] if message else ""
    if violations:
        return "outside the boundary: " + "; ".join(violations)
    return ""


def _config_text(config: EngineConfig | dict) -> str:
    settings = config.to_dict() if isinstance(config, EngineConfig) else config
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "vLLM defaults"


def common_settings(data: ReportData) -> dict:
    """The engine settings every trial shared (the space's fixed values, as a rule)."""
    if not data.trials:
        return {}
    configs = [t.engine_config.to_dict() for t in data.trials]
    return {k: v for k, v in configs[0].items() if all(c.get(k, object()) == v for c in configs)}


def trial_rows(data: ReportData) -> list[dict]:
    """Every trial, with its failure class, the figures it was judged on, and its role in the study.
    `settings` is what sets the trial apart: its configuration less the settings all trials share."""
    rows = []
    shared = common_settings(data)
    for t in data.trials:
        config = t.engine_config.to_dict()
        rows.append({
            "trial": t.trial_number, "attempt": t.attempt, "roles": data.roles(t), "state": t.state.value,
            "failure_class": t.failure_class, "config": config,
            "settings": {k: v for k, v in config.items() if k not in shared},
            "completed": _figure(t, lambda m: m.completed), "requests": _figure(t, lambda m: m.requests),
            "completed_rps": _figure(t, lambda m: m.completed_rps), "ttft_p95_s": _figure(t, lambda m: m.ttft_s.p95),
            "e2e_p95_s": _figure(t, lambda m: m.e2e_s.p95), "queue_s_mean": _figure(t, lambda m: m.queue_s_mean),
            "inference_s_mean": _figure(t, lambda m: m.inference_s_mean),
            "preemptions": _figure(t, lambda m: m.preemptions), "kv_tokens": data.kv_tokens.get(t.trial_number),
            "feasible": t.score.feasible if t.state is TrialState.COMPLETE and t.score else None, "why": _why(t),
        })
    return rows


def _ratio_text(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return ""
    if a == 0:
        return "" if b == 0 else "from 0"
    return f"{(b - a) / a * 100:+.0f}%"


def _num(value: Any, digits: int = 3, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _meets(t: StoredTrial | None) -> str:
    if t is None:
        return "-"
    if t.scored is None:
        return f"not scored ({t.failure_class or t.state})"
    return "yes" if t.scored.feasible else "no: " + "; ".join(t.scored.violations)


def side_by_side(data: ReportData) -> list[tuple[str, str, str, str]]:
    """(what, vLLM's default, the recommendation, change) rows: settings first, then what was measured."""
    base, rec = data.baseline, data.recommended
    rows: list[tuple[str, str, str, str]] = [
        ("trial", _num(base.trial_number) if base else "not run", _num(rec.trial_number) if rec else "none", "")]
    base_config = base.engine_config.to_dict() if base else {}
    rec_config = rec.engine_config.to_dict() if rec else {}
    for key in dict.fromkeys([*base_config, *rec_config]):
        a = base_config.get(key, DEFAULT_LABEL) if base else "-"
        b = rec_config.get(key, DEFAULT_LABEL) if rec else "-"
        rows.append((key, str(a), str(b), "" if a == b else "changed"))
    rows.append(("state", base.state + (f" ({base.failure_class})" if base and base.failure_class else "")
                 if base else "-", rec.state if rec else "-", ""))

    def metric(label: str, read: Callable[[Measurement], Any], digits: int = 3, unit: str = "",
               ratio: bool = True) -> None:
        a, b = _figure(base, read), _figure(rec, read)
        rows.append((label, _num(a, digits, unit), _num(b, digits, unit), _ratio_text(a, b) if ratio else ""))

    def completed(t: StoredTrial | None) -> str:
        return f"{t.measurement.completed}/{t.measurement.requests}" if t and t.measurement else "-"

    rows.append(("completed / requests", completed(base), completed(rec), ""))
    metric("completed req/s", lambda m: m.completed_rps)
    metric("output tok/s", lambda m: m.output_tps, 1)
    metric("p95 TTFT", lambda m: m.ttft_s.p95, 3, " s")
    metric("p95 end-to-end", lambda m: m.e2e_s.p95, 3, " s")
    metric("mean queue time (vLLM)", lambda m: m.queue_s_mean, 3, " s")
    metric("mean inference time (vLLM)", lambda m: m.inference_s_mean, 3, " s")
    pa, pb = _figure(base, lambda m: m.preemptions), _figure(rec, lambda m: m.preemptions)
    rows.append(("preemptions", _num(pa), _num(pb), "" if pa == pb or None in (pa, pb) else f"{pa} → {pb}"))
    metric("running peak", lambda m: m.running_peak, 0, ratio=False)
    metric("waiting peak", lambda m: m.waiting_peak, 0, ratio=False)
    ka, kb = _figure(base, lambda m: m.kv_usage_peak), _figure(rec, lambda m: m.kv_usage_peak)
    rows.append(("KV usage peak", f"{ka:.0%}" if ka is not None else "-", f"{kb:.0%}" if kb is not None else "-", ""))
    ta = data.kv_tokens.get(base.trial_number) if base else None
    tb = data.kv_tokens.get(rec.trial_number) if rec else None
    rows.append(("KV budget (tokens)", _num(ta), _num(tb), _ratio_text(ta, tb) if ta != tb else ""))
    rows.append((f"meets the {data.boundary.name} boundary", _meets(base), _meets(rec), ""))
    return rows


# --- the Pareto front, through Optuna --------------------------------------------------------------------


@contextmanager
def _quiet_optuna():
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def pareto_study(data: ReportData):
    """An in-memory Optuna study of the measured trials (numbered as in the real study), so that the
    Pareto front is Optuna's own and launch-less rejections do not stretch the axes."""
    import optuna
    from optuna.trial import TrialState, create_trial

    with _quiet_optuna():
        study = optuna.create_study(directions=["maximize", "minimize"])
    scored = {t.trial_number: t for t in data.scored}
    last = max((t.trial_number for t in data.trials), default=-1)
    for number in range(last + 1):
        t = scored.get(number)
        if t is None:
            study.add_trial(create_trial(state=TrialState.FAIL))  # a placeholder, so that numbers match
            continue
        attrs = {"config": _config_text(t.engine_config), "preemptions": t.measurement.preemptions}
        if t.scored.violations:
            attrs["violations"] = t.scored.violations
        study.add_trial(create_trial(values=[t.scored.completed_rps, t.scored.e2e_p95_s], user_attrs=attrs,
                                     constraints=dict(t.scored.constraints or {"feasible": 0.0})))
    return study


def pareto_numbers(data: ReportData) -> set[int]:
    if not data.scored:
        return set()
    return {t.number for t in pareto_study(data).best_trials}


# --- figures ---------------------------------------------------------------------------------------------


def _layout(fig, title: str, height: int = 480) -> None:
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      margin={"l": 70, "r": 40, "t": 80, "b": 60},
                      legend={"orientation": "h", "yanchor": "bottom", "y": -0.32, "x": 0})


def pareto_figure(data: ReportData):
    if not data.scored:
        return None
    import optuna
    import plotly.graph_objects as go

    study = pareto_study(data)
    with _quiet_optuna():  # a study with no feasible trial is drawn all the same, without the warning
        fig = optuna.visualization.plot_pareto_front(
            study, target_names=["completed requests / s", "p95 end-to-end latency (s)"])
    looks = {"Infeasible Trial": ("outside the boundary", COLORS["other"]),
             "Feasible Trial": ("within the boundary", COLORS["dominated"]),
             "Best Trial": ("Pareto front", COLORS["front"])}
    for trace in fig.data:
        kind = (trace.hovertemplate or "").split("<extra>")[-1].replace("</extra>", "")
        name, color = looks.get(kind, (kind, COLORS["other"]))
        # One colour per kind, named in the legend, in place of Optuna's colour scales by trial number.
        trace.update(name=name, showlegend=bool(len(trace.x or ())),
                     marker={"color": color, "size": 11, "showscale": False, "line": {"width": 1, "color": "#333"}})
    front = sorted(study.best_trials, key=lambda t: t.values[0])
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=[t.values[0] for t in front], y=[t.values[1] for t in front], mode="lines",
                                 line={"color": COLORS["front"], "width": 1.5, "dash": "dot"},
                                 name="Pareto front (line)", hoverinfo="skip"))
    rightmost = max(t.scored.completed_rps for t in data.scored)
    for role, t in data.featured:
        if t.scored is None:
            continue
        recommended = "recommended" in role
        fig.add_trace(go.Scatter(
            x=[t.scored.completed_rps], y=[t.scored.e2e_p95_s], mode="markers+text",
            text=[f"{role} (trial {t.trial_number})"], cliponaxis=False,
            textposition="top left" if t.scored.completed_rps >= rightmost else "top center",
            marker={"symbol": "star" if recommended else "diamond-open", "size": 22 if recommended else 18,
                    "color": COLORS["recommended" if recommended else "default"],
                    "line": {"width": 2, "color": COLORS["recommended" if recommended else "default"]}},
            name=f"{role}: trial {t.trial_number}", hovertemplate=f"{role}: trial {t.trial_number}<br>"
                                                                   "%{x:.3f} req/s, p95 %{y:.3f} s<extra></extra>"))
    b = data.boundary
    others = _other_limits(b)
    values = [t.scored.e2e_p95_s for t in data.scored if t.scored.e2e_p95_s > 0]
    if b.e2e_p95_s is not None:
        top = max([b.e2e_p95_s * 1.15, *(v * 1.1 for v in values)])
        fig.add_hrect(y0=b.e2e_p95_s, y1=top, fillcolor="firebrick", opacity=0.06, line_width=0)
        fig.add_hline(y=b.e2e_p95_s, line={"color": "firebrick", "dash": "dash"})
        log = bool(values) and top / min(values) > 20  # a far limit would flatten every point onto the axis
        if log:
            low = min(values) / 1.5
            fig.update_yaxes(type="log", range=[math.log10(low), math.log10(top)], **_log_ticks(low, top))
        else:
            fig.update_yaxes(range=[0, top])
        # Placed by hand: on a log axis an annotation's y is in log10 units.
        fig.add_annotation(x=0, xref="x domain", y=math.log10(b.e2e_p95_s) if log else b.e2e_p95_s, yref="y",
                           text=f"{b.name} boundary: p95 end-to-end ≤ {b.e2e_p95_s:g} s", showarrow=False,
                           xanchor="left", yanchor="bottom", font={"color": "firebrick"})
    _layout(fig, f"Pareto front: completed throughput against p95 end-to-end latency<br><sup>{b.name} "
                 f"boundary; also required: {', '.join(others) or 'nothing else'} (grey points broke a limit)</sup>",
            520)
    return fig


def _log_ticks(low: float, high: float) -> dict:
    """1-2-5 ticks for a log axis, labelled plainly (plotly's own crowd the axis with minor digits)."""
    ticks = [m * 10.0 ** e for e in range(-4, 10) for m in (1, 2, 5) if low <= m * 10.0 ** e <= high]
    return {"tickvals": ticks, "ticktext": [f"{v:,.0f}" if v >= 1 else f"{v:g}" for v in ticks]}


def _other_limits(b: Boundary) -> list[str]:
    """The boundary's limits that are not drawn in the throughput / p95 end-to-end plane."""
    parts = []
    if b.ttft_p95_s is not None:
        parts.append(f"p95 TTFT ≤ {b.ttft_p95_s:g} s")
    parts.append(f"completion ≥ {b.min_completion_ratio:.0%}")
    if b.makespan_factor is not None:
        parts.append(f"makespan ≤ {b.makespan_factor:g} x span + {b.makespan_grace_s:g} s")
    return parts


def _seqs_label(t: StoredTrial) -> str:
    value = t.engine_config.max_num_seqs
    return str(value) if value is not None else DEFAULT_LABEL


def preemption_figure(data: ReportData):
    trials = data.measured
    if not trials:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("preemptions against max_num_seqs",
                                                       "preemptions against the KV budget"))
    feasible = [t for t in trials if t.score and t.score.feasible]
    other = [t for t in trials if not (t.score and t.score.feasible)]
    for group, name, color in ((feasible, "within the boundary", COLORS["feasible"]),
                               (other, "outside the boundary, pruned or failed", COLORS["other"])):
        if not group:
            continue
        hover = [f"trial {t.trial_number}: {_config_text(t.engine_config)}<br>{t.measurement.preemptions} preemptions, "
                 f"KV budget {data.kv_tokens.get(t.trial_number, 'unknown')} tokens" for t in group]
        marker = {"color": color, "size": 12, "line": {"width": 1, "color": "#333"}}
        fig.add_trace(go.Scatter(x=[_seqs_label(t) for t in group], y=[t.measurement.preemptions for t in group],
                                 mode="markers+text", text=[f"#{t.trial_number}" for t in group],
                                 textposition="middle right", marker=marker, name=name, hovertext=hover,
                                 hoverinfo="text", legendgroup=name), row=1, col=1)
        with_kv = [t for t in group if t.trial_number in data.kv_tokens]
        if with_kv:
            fig.add_trace(go.Scatter(x=[data.kv_tokens[t.trial_number] for t in with_kv],
                                     y=[t.measurement.preemptions for t in with_kv], mode="markers+text",
                                     text=[f"#{t.trial_number}" for t in with_kv], textposition="middle right",
                                     marker=marker, name=name, hovertext=[hover[group.index(t)] for t in with_kv],
                                     hoverinfo="text", legendgroup=name, showlegend=False), row=1, col=2)
    labels = sorted({_seqs_label(t) for t in trials}, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=labels, title_text="max_num_seqs",
                     row=1, col=1)
    budgets = list(data.kv_tokens.values())
    ticks = _log_ticks(min(budgets) / 2, max(budgets) * 2) if budgets else {}
    fig.update_xaxes(type="log", title_text="KV cache budget (tokens, as vLLM logged it)", row=1, col=2, **ticks)
    fig.update_yaxes(title_text="preemptions during the replay", rangemode="tozero")
    _layout(fig, "Preemptions against max_num_seqs and the KV budget")
    return fig


def _trial_label(data: ReportData, t: StoredTrial) -> str:
    roles = [r for r in data.roles(t) if r != "Pareto"]
    return f"trial {t.trial_number}" + (f" ({', '.join(roles)})" if roles else "")


def time_split_figure(data: ReportData):
    trials = [t for t in data.measured
              if t.measurement.queue_s_mean is not None or t.measurement.inference_s_mean is not None]
    if not trials:
        return None
    import plotly.graph_objects as go

    labels = [_trial_label(data, t) for t in trials]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=[t.measurement.queue_s_mean or 0.0 for t in trials], name="queued (waiting)",
                         marker_color=COLORS["queue"], hovertemplate="%{x}: %{y:.3f} s queued<extra></extra>"))
    fig.add_trace(go.Bar(x=labels, y=[t.measurement.inference_s_mean or 0.0 for t in trials],
                         name="inference (prefill and decode)", marker_color=COLORS["inference"],
                         hovertemplate="%{x}: %{y:.3f} s in inference<extra></extra>"))
    e2e = [_mean_e2e(data.requests.get(t.trial_number, [])) for t in trials]
    if any(v is not None for v in e2e):
        fig.add_trace(go.Scatter(x=labels, y=e2e, mode="markers", name="mean end-to-end, as users saw it",
                                 marker={"symbol": "diamond", "size": 12, "color": "#222"},
                                 hovertemplate="%{x}: %{y:.3f} s end-to-end<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="seconds per request (mean)")
    _layout(fig, "Where the time went: queue against inference<br><sup>means of vLLM's "
                 "request_queue_time and request_inference_time histograms over the replay</sup>")
    return fig


def timeline_figure(data: ReportData):
    featured = [(role, t) for role, t in data.featured if t.trial_number in data.timelines]
    if not featured:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("running sequences", "waiting sequences", "KV-cache usage"))
    for role, t in featured:
        samples = data.timelines[t.trial_number]
        color = COLORS["recommended" if "recommended" in role else "default"]
        x = [s.t_s for s in samples]
        name = f"{role} (trial {t.trial_number})"
        for row, values in ((1, [s.running for s in samples]), (2, [s.waiting for s in samples]),
                            (3, [s.kv_usage * 100 for s in samples])):
            fig.add_trace(go.Scatter(x=x, y=values, mode="lines", line={"color": color, "width": 2}, name=name,
                                     legendgroup=name, showlegend=row == 1), row=row, col=1)
    fig.update_yaxes(title_text="running", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="waiting", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="KV used (%)", range=[0, 105], row=3, col=1)
    fig.update_xaxes(title_text="seconds since the replay started", row=3, col=1)
    _layout(fig, "Running, waiting and KV-cache usage during the replay (sampled every 0.25 s)", 720)
    fig.update_layout(legend={"y": -0.14})
    return fig


def output_lengths_figure(data: ReportData):
    trials = data.measured
    if not trials:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    featured = [(role, t) for role, t in data.featured if data.requests.get(t.trial_number)]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5],
                        subplot_titles=("output tokens per trial: requested and served",
                                        "per request: requested against served" if featured else ""))
    labels = [_trial_label(data, t) for t in trials]
    fig.add_trace(go.Bar(x=labels, y=[t.measurement.requested_output_tokens for t in trials], name="requested",
                         marker_color="#bbbbbb"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[t.measurement.actual_output_tokens for t in trials], name="served",
                         marker_color=COLORS["feasible"]), row=1, col=1)
    longest = 1
    for role, t in featured:
        rows = data.requests[t.trial_number]
        longest = max([longest, *(r.requested_tokens for r in rows)])
        fig.add_trace(go.Scatter(
            x=[r.requested_tokens for r in rows], y=[r.output_tokens for r in rows], mode="markers",
            marker={"color": COLORS["recommended" if "recommended" in role else "default"], "size": 9,
                    "symbol": "circle" if "recommended" in role else "circle-open"},
            name=f"{role} (trial {t.trial_number})",
            hovertext=[f"request {r.index}: {r.output_tokens}/{r.requested_tokens} tokens, {r.outcome.value}" for r in rows],
            hoverinfo="text"), row=1, col=2)
    if featured:
        fig.add_trace(go.Scatter(x=[0, longest], y=[0, longest], mode="lines", name="served = requested",
                                 line={"color": "#888", "dash": "dash"}, hoverinfo="skip"), row=1, col=2)
        fig.update_xaxes(title_text="requested output tokens", row=1, col=2)
        fig.update_yaxes(title_text="served output tokens", row=1, col=2)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="output tokens (sum over requests)", row=1, col=1)
    _layout(fig, "Requested against actual output lengths")
    return fig


FIGURES = (("pareto", pareto_figure), ("side_by_side", None), ("trials", None), ("preemptions", preemption_figure),
           ("time_split", time_split_figure), ("timelines", timeline_figure), ("output_lengths", output_lengths_figure))


# --- the page --------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def measured_on(data: ReportData) -> list[dict]:
    """Each distinct machine and vLLM version the study's trials were measured on, with their trials."""
    groups: dict[tuple[str, str], list[int]] = {}
    for t in data.trials:
        if t.hardware and t.state is not TrialState.INFEASIBLE:
            groups.setdefault((hardware_line(t.hardware), t.vllm_version), []).append(t.trial_number)
    return [{"hardware": hw, "vllm_version": version, "trials": numbers}
            for (hw, version), numbers in groups.items()]


def trace_line(settings: StudySettings, requests: int | None = None) -> str:
    selection = ", ".join(f"{k}={v}" for k, v in settings.trace_selection.to_dict().items()
                          if v is not None) or "as recorded"
    count = f", {requests} requests" if requests is not None else ""
    return f"{Path(settings.trace_path).name} (sha256 {settings.trace_sha256[:12]}{count}; {selection})"


def recommendation_lines(data: ReportData) -> list[str]:
    """The recommendation as sentences: what, under which boundary, on which machine, trace and vLLM."""
    rec, settings = data.recommendation, data.settings
    if rec is None:
        machines = "; ".join(f"{m['hardware']}, vLLM {m['vllm_version']}" for m in measured_on(data)) or "no machine"
        return [f"No trial met the {boundary_line(data.boundary)} boundary yet.",
                f"Trials measured on {machines}, trace {trace_line(settings)}."]
    t, m = rec.trial, rec.trial.measurement
    lines = [f"Recommended for the {boundary_line(rec.boundary)} boundary: trial {t.trial_number}.",
             t.serve_command,
             f"Measured on {hardware_line(t.hardware)}, vLLM {t.vllm_version}, trace "
             f"{trace_line(settings, m.requests)}.",
             f"Completed {m.completed}/{m.requests} at {t.scored.completed_rps:.3f} req/s, "
             f"p95 TTFT {_num(m.ttft_s.p95)} s, p95 end-to-end {t.scored.e2e_p95_s:.3f} s, "
             f"{m.preemptions} preemptions."]
    base = rec.baseline
    if base is None:
        lines.append("vLLM's default configuration was not run in this study.")
    elif rec.gain is None:
        lines.append(f"vLLM's default configuration (trial {base.trial_number}) gave no score to compare: "
                     f"{base.failure_class or ('infeasible' if base.state is TrialState.COMPLETE else base.state)}.")
    elif base.trial_number == t.trial_number:
        lines.append("vLLM's default configuration is itself the recommendation: no trial beat it.")
    else:
        g = rec.gain
        lines.append(f"Against vLLM's default configuration (trial {base.trial_number}): completed throughput "
                     f"x{g['completed_rps_ratio']:.2f}, p95 end-to-end x{g['e2e_p95_ratio']:.2f}"
                     f"{'' if base.feasible else ' (the default broke the boundary)'}.")
    return lines


def summary(data: ReportData) -> dict:
    """The report's content as data: what `--json` prints and the terminal summary shows."""
    return {
        "study": data.settings.name, "generated_at": data.generated_at, "model": data.settings.model,
        "boundary": data.boundary.to_dict(), "boundary_text": boundary_line(data.boundary),
        "trace": {"path": data.settings.trace_path, "sha256": data.settings.trace_sha256,
                  "selection": data.settings.trace_selection.to_dict()},
        "measured_on": measured_on(data),
        "recommendation": recommendation_dict(data.recommendation, data.settings) if data.recommendation else None,
        "recommendation_text": recommendation_lines(data),
        "default_trial": data.baseline.trial_number if data.baseline else None,
        "side_by_side": [{"what": w, "default": a, "recommended": b, "change": c} for w, a, b, c in side_by_side(data)],
        "common_settings": common_settings(data), "trials": trial_rows(data), "pareto": sorted(data.pareto),
        "timelines": sorted(data.timelines),
    }


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1280px;
       color: #222; padding: 0 16px; }
h1 { margin-bottom: 4px; } h2 { margin-top: 36px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #555; margin: 2px 0; }
.rec { background: #f4f8fc; border-left: 4px solid #1f77b4; padding: 12px 16px; margin: 16px 0; }
.rec.none { background: #fdf3f3; border-left-color: #d62728; }
pre { background: #272822; color: #f8f8f2; padding: 10px; overflow-x: auto; border-radius: 4px; white-space: pre-wrap; }
table { border-collapse: collapse; font-size: 14px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.recommended td { background: #fff3f3; } tr.default td { background: #f3f7ff; }
.scroll { overflow-x: auto; } .note { color: #777; font-style: italic; }
.why { min-width: 320px; max-width: 480px; font-size: 13px; color: #444; }
"""


def _table(head: list[str], rows: list[list[str]], row_classes: list[str] | None = None,
           column_classes: dict[int, str] | None = None) -> str:
    column_classes = column_classes or {}
    out = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="{column_classes[j]}">{_e(c)}</td>' if j in column_classes else f"<td>{_e(c)}</td>"
                        for j, c in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _trials_table(data: ReportData) -> str:
    head = ["trial", "role", "state", "failure class", "settings", "completed", "req/s", "p95 TTFT s",
            "p95 e2e s", "mean queue s", "preemptions", "KV budget (tokens)", "within boundary", "why"]
    rows, classes = [], []
    for r in trial_rows(data):
        completed = f"{r['completed']}/{r['requests']}" if r["requests"] is not None else "-"
        rows.append([str(r["trial"]) + (f" (attempt {r['attempt']})" if r["attempt"] > 1 else ""),
                     ", ".join(r["roles"]) or "", r["state"], r["failure_class"] or "-",
                     ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "vLLM defaults",
                     completed, _num(r["completed_rps"]), _num(r["ttft_p95_s"]), _num(r["e2e_p95_s"]),
                     _num(r["queue_s_mean"]), _num(r["preemptions"]), _num(r["kv_tokens"]), _num(r["feasible"]),
                     r["why"]])
        classes.append("recommended" if "recommended" in r["roles"] else "default" if "default" in r["roles"] else "")
    return _table(head, rows, classes, {**{j: "num" for j in range(5, 12)}, 13: "why"})


def _figure_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, default_width="100%",
                       config={"displaylogo": False, "responsive": True})


def render_html(data: ReportData) -> str:
    """The whole page, plotly.js inlined: it needs nothing from the network."""
    from plotly.offline import get_plotlyjs

    s = data.settings
    rec_lines = recommendation_lines(data)
    parts = [f"<h1>Study {_e(s.name)}</h1>",
             f'<p class="meta">model {_e(s.model)} ({_e(s.model_info.architecture)}); search space '
             f"{_e(s.space_name)}, sampler {_e(s.sampler)}; created {_e(s.created_at)}; report generated "
             f"{_e(data.generated_at)}</p>",
             f'<p class="meta">boundary: {_e(boundary_line(data.boundary))}</p>',
             f'<p class="meta">trace: {_e(trace_line(s))}</p>']
    for m in measured_on(data):
        parts.append(f'<p class="meta">measured on {_e(m["hardware"])}, vLLM {_e(m["vllm_version"])} '
                     f'(trials {_e(", ".join(map(str, m["trials"])))})</p>')
    if data.recommendation is not None:
        parts.append('<div class="rec" id="recommendation">'
                     f"<p><b>{_e(rec_lines[0])}</b></p><pre>{_e(rec_lines[1])}</pre>"
                     + "".join(f"<p>{_e(line)}</p>" for line in rec_lines[2:]) + "</div>")
    else:
        parts.append('<div class="rec none" id="recommendation">' + "".join(f"<p>{_e(x)}</p>" for x in rec_lines)
                     + "</div>")
    counts: dict[str, int] = {}
    for t in data.trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    parts.append(f'<p class="meta">{len(data.trials)} trials: '
                 f"{_e(', '.join(f'{n} {state}' for state, n in sorted(counts.items())))}</p>")
    sections = {
        "pareto": "Pareto front",
        "side_by_side": "vLLM's default configuration and the recommendation, side by side",
        "trials": "Every trial",
        "preemptions": "Preemptions, max_num_seqs and the KV budget",
        "time_split": "Where the time went",
        "timelines": "Running, waiting and KV usage: the default and the recommended trial",
        "output_lengths": "Requested and actual output lengths",
    }
    for key, build in FIGURES:
        parts.append(f'<section id="{key}"><h2>{_e(sections[key])}</h2>')
        if key == "side_by_side":
            base, rec = data.baseline, data.recommended
            rows = side_by_side(data)
            parts.append(_table(["", f"vLLM default (trial {base.trial_number})" if base else "vLLM default",
                                 f"recommended (trial {rec.trial_number})" if rec else "recommended", "change"],
                                [list(r) for r in rows]))
            for role, t in (("vLLM default", base), ("recommended", rec)):
                if t is not None:
                    parts.append(f"<p>{_e(role)}:</p><pre>{_e(t.serve_command)}</pre>")
        elif key == "trials":
            shared = common_settings(data)
            if shared:
                parts.append(f'<p class="meta">every trial also had: {_e(_config_text(shared))}</p>')
            parts.append(f'<div class="scroll">{_trials_table(data)}</div>')
        else:
            fig = build(data)
            if fig is None:
                why = NO_TIMELINE if key == "timelines" else "no measured trial to show"
                parts.append(f'<p class="note" data-empty="{key}">{_e(why)}</p>')
            else:
                parts.append(f'<div class="figure" data-figure="{key}">{_figure_html(fig, f"fig-{key}")}</div>')
                if key == "timelines":
                    missing = [f"{role} (trial {t.trial_number})" for role, t in data.featured
                               if t.trial_number not in data.timelines]
                    if missing:
                        parts.append(f'<p class="note">{_e(NO_TIMELINE)} for {_e(", ".join(missing))}</p>')
        parts.append("</section>")
    body = "\n".join(parts)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>tuner report: {_e(s.name)}</title><style>{_CSS}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head>\n<body>\n{body}\n</body></html>\n")

