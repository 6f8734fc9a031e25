"""The report's plotly figures, each built from a `ReportData`: the Pareto front with the boundary drawn,
preemptions against max_num_seqs and the KV budget, queue against inference time, the default's and the
recommendation's timelines, and requested against served output lengths.

Each builder returns a plotly Figure, or None when the study has nothing to draw in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.report.content import DEFAULT_LABEL
from tuner.report.data import ReportData, config_text, pareto_study, quiet_optuna
from tuner.scoring import Boundary
from tuner.storage import StoredTrial
from tuner.workers.replay import RequestRecord

if TYPE_CHECKING:
    from plotly.graph_objects import Figure


@dataclass(frozen=True)
class Palette:
    """The report's colours: one per role of a trial and per kind of point or bar."""

    default: str = "#1f77b4"
    recommended: str = "#d62728"
    queue: str = "#ff7f0e"
    inference: str = "#1f77b4"
    feasible: str = "#2ca02c"
    other: str = "#9e9e9e"
    front: str = "#ff7f0e"
    dominated: str = "#17becf"


COLORS = Palette()


def _role_color(role: str) -> str:
    return COLORS.recommended if "recommended" in role else COLORS.default


def _mean_e2e(requests: list[RequestRecord]) -> float | None:
    values = [r.e2e_s for r in requests if r.e2e_s is not None]
    return sum(values) / len(values) if values else None


def _layout(fig: Figure, title: str, height: int = 480) -> None:
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      margin={"l": 70, "r": 40, "t": 80, "b": 60},
                      legend={"orientation": "h", "yanchor": "bottom", "y": -0.32, "x": 0})


def pareto_figure(data: ReportData) -> Figure | None:
    """Completed throughput against p95 end-to-end latency of the scored trials: Optuna's Pareto front,
    the boundary's e2e limit drawn, the default and the recommendation marked."""
    if not data.scored:
        return None
    import optuna
    import plotly.graph_objects as go

    study = pareto_study(data.trials)
    with quiet_optuna():  # a study with no feasible trial is drawn all the same, without the warning
        fig = optuna.visualization.plot_pareto_front(
            study, target_names=["completed requests / s", "p95 end-to-end latency (s)"])
    looks = {"Infeasible Trial": ("outside the boundary", COLORS.other),
             "Feasible Trial": ("within the boundary", COLORS.dominated),
             "Best Trial": ("Pareto front", COLORS.front)}
    for trace in fig.data:
        kind = (trace.hovertemplate or "").split("<extra>")[-1].replace("</extra>", "")
        name, color = looks.get(kind, (kind, COLORS.other))
        # One colour per kind, named in the legend, in place of Optuna's colour scales by trial number.
        trace.update(name=name, showlegend=bool(len(trace.x or ())),
                     marker={"color": color, "size": 11, "showscale": False, "line": {"width": 1, "color": "#333"}})
    front = sorted(study.best_trials, key=lambda t: t.values[0])
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=[t.values[0] for t in front], y=[t.values[1] for t in front], mode="lines",
                                 line={"color": COLORS.front, "width": 1.5, "dash": "dot"},
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
                    "color": COLORS.recommended if recommended else COLORS.default,
                    "line": {"width": 2, "color": COLORS.recommended if recommended else COLORS.default}},
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


def preemption_figure(data: ReportData) -> Figure | None:
    """Preemptions of each measured trial against its max_num_seqs, and against its KV budget."""
    trials = data.measured
    if not trials:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("preemptions against max_num_seqs",
                                                       "preemptions against the KV budget"))
    feasible = [t for t in trials if t.score and t.score.feasible]
    other = [t for t in trials if not (t.score and t.score.feasible)]
    for group, name, color in ((feasible, "within the boundary", COLORS.feasible),
                               (other, "outside the boundary, pruned or failed", COLORS.other)):
        if not group:
            continue
        hover = [f"trial {t.trial_number}: {config_text(t.engine_config)}<br>{t.measurement.preemptions} preemptions, "
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


def time_split_figure(data: ReportData) -> Figure | None:
    """Per measured trial, the mean time a request queued and spent in inference (vLLM's
    histograms), with the mean end-to-end time users saw."""
    trials = [t for t in data.measured
              if t.measurement.queue_s_mean is not None or t.measurement.inference_s_mean is not None]
    if not trials:
        return None
    import plotly.graph_objects as go

    labels = [_trial_label(data, t) for t in trials]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=[t.measurement.queue_s_mean or 0.0 for t in trials], name="queued (waiting)",
                         marker_color=COLORS.queue, hovertemplate="%{x}: %{y:.3f} s queued<extra></extra>"))
    fig.add_trace(go.Bar(x=labels, y=[t.measurement.inference_s_mean or 0.0 for t in trials],
                         name="inference (prefill and decode)", marker_color=COLORS.inference,
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


def timeline_figure(data: ReportData) -> Figure | None:
    """Running and waiting sequences and KV-cache usage over the replay, for the default and the
    recommended trial where their timeline was recorded."""
    featured = [(role, t) for role, t in data.featured if t.trial_number in data.timelines]
    if not featured:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("running sequences", "waiting sequences", "KV-cache usage"))
    for role, t in featured:
        samples = data.timelines[t.trial_number]
        color = _role_color(role)
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


def output_lengths_figure(data: ReportData) -> Figure | None:
    """Output tokens requested against served: summed per trial, and request by request for the
    default and the recommended trial."""
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
                         marker_color=COLORS.feasible), row=1, col=1)
    longest = 1
    for role, t in featured:
        rows = data.requests[t.trial_number]
        longest = max([longest, *(r.requested_tokens for r in rows)])
        fig.add_trace(go.Scatter(
            x=[r.requested_tokens for r in rows], y=[r.output_tokens for r in rows], mode="markers",
            marker={"color": _role_color(role), "size": 9,
                    "symbol": "circle" if "recommended" in role else "circle-open"},
            name=f"{role} (trial {t.trial_number})",
            hovertext=[f"request {r.index}: {r.output_tokens}/{r.requested_tokens} tokens, {r.outcome.value}"
                       for r in rows],
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
