"""The report's figures of where each trial's time and memory went: preemptions against max_num_seqs and the KV
budget, queue against inference time, the default's and the recommendation's timelines, requested against served
output lengths, and the replicas your traffic needs. Each builder returns a plotly Figure, or None when the study
has nothing to draw in it.
"""

from __future__ import annotations

from itertools import cycle
from typing import TYPE_CHECKING

from tuner.analysis.replicas import MeasuredCapacity, replicas_for
from tuner.report.content import DEFAULT_LABEL
from tuner.report.data import ReportData, config_text
from tuner.report.figure_style import COLORS, layout, log_ticks, role_color, trial_label
from tuner.storage import StoredTrial
from tuner.workers.request_record import RequestRecord

if TYPE_CHECKING:
    from plotly.graph_objects import Figure


def _mean_e2e(requests: list[RequestRecord]) -> float | None:
    values = [r.e2e_s for r in requests if r.e2e_s is not None]
    return sum(values) / len(values) if values else None


def _seqs_label(t: StoredTrial) -> str:
    value = t.engine_config.max_num_seqs
    return str(value) if value is not None else DEFAULT_LABEL


def preemption_figure(data: ReportData) -> Figure | None:
    """Preemptions of each measured trial against its max_num_seqs, and against its KV budget."""
    trials = data.measured
    if not trials:
        return None
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
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
    ticks = log_ticks(min(budgets) / 2, max(budgets) * 2) if budgets else {}
    fig.update_xaxes(type="log", title_text="KV cache budget (tokens, as vLLM logged it)", row=1, col=2, **ticks)
    fig.update_yaxes(title_text="preemptions during the replay", rangemode="tozero")
    layout(fig, "Preemptions against max_num_seqs and the KV budget")
    return fig


def time_split_figure(data: ReportData) -> Figure | None:
    """Per measured trial, the mean time a request queued and spent in inference (vLLM's
    histograms), with the mean end-to-end time users saw."""
    trials = [t for t in data.measured
              if t.measurement.queue_s_mean is not None or t.measurement.inference_s_mean is not None]
    if not trials:
        return None
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
    import plotly.graph_objects as go

    labels = [trial_label(data, t) for t in trials]
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
    layout(fig, "Where the time went: queue against inference<br><sup>means of vLLM's "
                "request_queue_time and request_inference_time histograms over the replay</sup>")
    return fig


def timeline_figure(data: ReportData) -> Figure | None:
    """Running and waiting sequences and KV-cache usage over the replay, for the default and the
    recommended trial where their timeline was recorded."""
    featured = [(role, t) for role, t in data.featured if t.trial_number in data.timelines]
    if not featured:
        return None
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("running sequences", "waiting sequences", "KV-cache usage"))
    for role, t in featured:
        samples = data.timelines[t.trial_number]
        color = role_color(role)
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
    layout(fig, "Running, waiting and KV-cache usage during the replay (sampled every 0.25 s)", 720)
    fig.update_layout(legend={"y": -0.14})
    return fig


def output_lengths_figure(data: ReportData) -> Figure | None:
    """Output tokens requested against served: summed per trial, and request by request for the
    default and the recommended trial."""
    trials = data.measured
    if not trials:
        return None
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    featured = [(role, t) for role, t in data.featured if data.requests.get(t.trial_number)]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5],
                        subplot_titles=("output tokens per trial: requested and served",
                                        "per request: requested against served" if featured else ""))
    labels = [trial_label(data, t) for t in trials]
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
            marker={"color": role_color(role), "size": 9,
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
    layout(fig, "Requested against actual output lengths")
    return fig


def replicas_figure(data: ReportData) -> Figure | None:
    """Replicas against traffic: for each planned configuration, the replicas that carry a rate within the boundary at
    the plan's headroom, a step line at its capacity's central value and a band between the ends of its interval;
    the plan's peak marked. None without a plan or a capacity to draw."""
    plan = data.capacity_plan
    drawn = [c for c in plan.configurations if c.capacity is not None] if plan is not None else []
    if plan is None or not drawn:
        return None
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
    import plotly.graph_objects as go

    peak = plan.traffic.peak.rps
    top = max([peak, *(plan.traffic.hourly_rps or ())]) * 1.25  # a trace shorter than a day has no hours
    rates = [top * i / 400 for i in range(401)]
    fig = go.Figure()
    for c, color in zip(drawn, cycle((COLORS.default, COLORS.recommended, *COLORS.trials))):
        name = f"trial {c.trial} ({c.role})"
        central = [replicas_for(r, MeasuredCapacity.once(c.capacity.rps), plan.headroom).low for r in rates]
        if not c.capacity.measured_once:
            ends = [replicas_for(r, c.capacity, plan.headroom) for r in rates]
            fig.add_trace(go.Scatter(x=rates, y=[e.high for e in ends], mode="lines", line={"width": 0,
                                     "shape": "hv", "color": color}, hoverinfo="skip", showlegend=False))
            fig.add_trace(go.Scatter(x=rates, y=[e.low for e in ends], mode="lines", fill="tonexty", opacity=0.2,
                                     line={"width": 0, "shape": "hv", "color": color},
                                     name=f"{name}: its capacity's 95% interval", hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=rates, y=central, mode="lines", line={"shape": "hv", "color": color},
                                 name=f"{name}: {c.capacity.text()}"))
    fig.add_vline(x=peak, line={"color": COLORS.limit, "dash": "dash"},
                  annotation_text=f"peak {peak:.3g} req/s", annotation_position="top left")
    fig.update_xaxes(title_text="your traffic, req/s", rangemode="tozero")
    fig.update_yaxes(title_text="replicas", rangemode="tozero")
    layout(fig, f"Replicas against traffic, each replica at {plan.headroom:.0%} of its capacity within the "
                "boundary")
    return fig
