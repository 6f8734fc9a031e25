"""The report's plotly figures, each built from a `ReportData`: the Pareto front with the boundary drawn, each
trial's load curve (p95 latencies against the offered load, the knee marked), preemptions against
max_num_seqs and the KV budget, queue against inference time, the default's and the recommendation's
timelines, and requested against served output lengths.

Each builder returns a plotly Figure, or None when the study has nothing to draw in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import cycle
from typing import TYPE_CHECKING

import optuna

from tuner.capacity import JudgedProbe, Verdict
from tuner.replicas import MeasuredCapacity, replicas_for
from tuner.report.content import DEFAULT_LABEL
from tuner.report.data import ReportData, config_text, pareto_study, quiet_optuna
from tuner.scoring import Boundary, Capacity
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
    passed: str = "#2ca02c"
    failed: str = "#d62728"
    inconclusive: str = "#ff9f1c"
    limit: str = "firebrick"
    # The load curves of trials other than the default and the recommendation, in turn.
    trials: tuple[str, ...] = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#2ca02c",
                               "#ff7f0e")


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
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
    import plotly.graph_objects as go

    study = pareto_study(data.trials)
    with quiet_optuna():  # a study with no feasible trial is drawn all the same, without the warning
        fig = optuna.visualization.plot_pareto_front(
            study, target_names=["capacity within the boundary (req/s)", "p95 end-to-end latency at your traffic (s)"]
            if data.searched else ["completed requests / s", "p95 end-to-end latency (s)"])
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
    rightmost = max(t.scored.objectives[0] for t in data.scored)
    for role, t in data.featured:
        if t.scored is None:
            continue
        recommended = "recommended" in role
        fig.add_trace(go.Scatter(
            x=[t.scored.objectives[0]], y=[t.scored.e2e_p95_s], mode="markers+text",
            text=[f"{role} (trial {t.trial_number})"], cliponaxis=False,
            textposition="top left" if t.scored.objectives[0] >= rightmost else "top center",
            marker={"symbol": "star" if recommended else "diamond-open", "size": 22 if recommended else 18,
                    "color": COLORS.recommended if recommended else COLORS.default,
                    "line": {"width": 2, "color": COLORS.recommended if recommended else COLORS.default}},
            name=f"{role}: trial {t.trial_number}", hovertemplate=f"{role}: trial {t.trial_number}<br>"
                                                                   "%{x:.3f} req/s, p95 %{y:.3f} s<extra></extra>"))
    b = data.boundary
    others = _other_limits(b)
    values = [t.scored.e2e_p95_s for t in data.scored if t.scored.e2e_p95_s > 0]
    if b.e2e_p95_s is not None:
        top = _latency_top(values, b.e2e_p95_s)
        fig.add_hrect(y0=b.e2e_p95_s, y1=top, fillcolor="firebrick", opacity=0.06, line_width=0)
        fig.add_hline(y=b.e2e_p95_s, line={"color": "firebrick", "dash": "dash"})
        log = _fit_latency_axis(fig, values, top)
        _label_limit(fig, b.e2e_p95_s, f"{b.name} boundary: p95 end-to-end ≤ {b.e2e_p95_s:g} s", log)
    against = ("capacity against p95 end-to-end latency at your traffic" if data.searched
               else "completed throughput against p95 end-to-end latency")
    _layout(fig, f"Pareto front: {against}<br><sup>{b.name} "
                 f"boundary; also required: {', '.join(others) or 'nothing else'} (grey points broke a limit)</sup>",
            520)
    return fig


def _latency_top(values: list[float], limit: float | None) -> float:
    """The top of a latency axis: above every value and above the limit drawn on it."""
    return max([limit * 1.15 if limit is not None else 0.0, *(v * 1.1 for v in values)])


def _fit_latency_axis(fig: Figure, values: list[float], top: float, **where: int) -> bool:
    """Fit a latency axis (of the subplot at `where`) from 0 to `top`, or on a log scale when the values span more
    than 20 times (a far limit or an overloaded probe would flatten every other point onto the axis). True when
    the scale is log."""
    log = bool(values) and top / min(values) > 20
    if log:
        low = min(values) / 1.5
        fig.update_yaxes(type="log", range=[math.log10(low), math.log10(top)], **_log_ticks(low, top), **where)
    else:
        fig.update_yaxes(range=[0, top], **where)
    return log


def _label_limit(fig: Figure, limit: float, text: str, log: bool, axis: str = "") -> None:
    """Write `text` above the line of a limit, at the left of the plot whose axes end in `axis` ("" or "2")."""
    # Placed by hand: on a log axis an annotation's y is in log10 units.
    fig.add_annotation(x=0, xref=f"x{axis} domain", y=math.log10(limit) if log else limit, yref=f"y{axis}",
                       text=text, showarrow=False, xanchor="left", yanchor="bottom", font={"color": COLORS.limit})


def _log_ticks(low: float, high: float) -> dict:
    """1-2-5 ticks for a log axis, labelled plainly (plotly's own crowd the axis with minor digits)."""
    ticks = [m * 10.0 ** e for e in range(-4, 10) for m in (1, 2, 5) if low <= m * 10.0 ** e <= high]
    return {"tickvals": ticks, "ticktext": [f"{v:,.0f}" if v >= 1 else f"{v:g}" for v in ticks]}


def _other_limits(b: Boundary) -> list[str]:
    """The boundary's limits that are not drawn in the throughput / p95 end-to-end plane."""
    parts = []
    if b.ttft_p95_s is not None:
        parts.append(f"p95 TTFT ≤ {b.ttft_p95_s:g} s")
    if b.ttft_per_1k_prompt_p95_s is not None:
        parts.append(f"p95 TTFT ≤ {b.ttft_per_1k_prompt_p95_s:g} s per 1,000 prompt tokens")
    if b.tpot_p95_s is not None:
        parts.append(f"p95 TPOT ≤ {b.tpot_p95_s:g} s")
    parts.append(f"completion ≥ {b.min_completion_ratio:.0%}")
    if b.makespan_factor is not None:
        parts.append(f"makespan ≤ {b.makespan_factor:g} x span + {b.makespan_grace_s:g} s")
    return parts


def _drawn_probes(t: StoredTrial) -> list[JudgedProbe]:
    """The trial's probes that measured an offered load and both p95 latencies, from the lowest load up."""
    drawn = [j for j in t.probes if j.probe.measurement is not None and j.probe.offered_rps is not None
             and j.probe.measurement.ttft_s.p95 is not None and j.probe.measurement.e2e_s.p95 is not None]
    return sorted(drawn, key=lambda j: j.probe.offered_rps or 0.0)


def _knee(capacity: Capacity | None, probes: list[JudgedProbe]) -> JudgedProbe | None:
    """The probe at the trial's capacity (its highest load that passed), if it is among those drawn."""
    if capacity is None or capacity.factor is None:
        return None
    factor = capacity.factor
    return next((j for j in probes if math.isclose(j.probe.factor, factor)), None)


def _probe_hover(name: str, j: JudgedProbe) -> str:
    m = j.probe.measurement
    assert m is not None
    why = "".join(f"<br>{reason}" for reason in j.reasons)
    return (f"{name}, probe {j.probe.index + 1}: {j.probe.offered_rps:.3g} req/s offered (x{j.probe.factor:.3g} the "
            f"reference load), {m.completed}/{m.requests} completed<br>p95 TTFT {m.ttft_s.p95:.3f} s, p95 end-to-end "
            f"{m.e2e_s.p95:.3f} s<br><b>{j.verdict.value}</b>{why}")


VERDICT_MARKERS = {Verdict.PASS: ("circle", COLORS.passed), Verdict.FAIL: ("x", COLORS.failed),
                   Verdict.INCONCLUSIVE: ("diamond", COLORS.inconclusive)}
KNEE_NAME = "knee: the highest load that passed (capacity)"


def load_curve_figure(data: ReportData) -> Figure | None:
    """Each trial's load curve, from its probes: p95 TTFT (left) and p95 end-to-end latency (right) against the
    offered load in req/s, one line per trial; each probe's marker shaped and coloured by its verdict (pass,
    fail, inconclusive); the boundary's TTFT and end-to-end limits as dashed lines where it sets them; each
    trial's knee, its capacity, marked with a star. None when no trial probed a load (a study at a fixed
    load)."""
    curves = [(t, probes) for t in data.trials if (probes := _drawn_probes(t))]
    if not curves:
        return None
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    b = data.boundary
    panels = ((1, "ttft_s", b.ttft_p95_s, "p95 TTFT"), (2, "e2e_s", b.e2e_p95_s, "p95 end-to-end latency"))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=[f"{label} against offered load" for _, _, _, label in panels])
    others = cycle(COLORS.trials)
    for t, probes in curves:
        roles = ", ".join(r for r in data.roles(t) if r != "Pareto")
        color = _role_color(roles) if roles else next(others)
        name = _trial_label(data, t)
        x = [j.probe.offered_rps for j in probes]
        hover = [_probe_hover(name, j) for j in probes]
        knee = _knee(data.capacity(t), probes)
        for col, figure, _, _ in panels:
            fig.add_trace(go.Scatter(
                x=x, y=[getattr(j.probe.measurement, figure).p95 for j in probes], mode="lines+markers",
                line={"color": color, "width": 2.5 if roles else 1.5},
                marker={"symbol": [VERDICT_MARKERS[j.verdict][0] for j in probes], "size": 10,
                        "color": [VERDICT_MARKERS[j.verdict][1] for j in probes], "line": {"width": 1, "color": color}},
                name=name, legendgroup=name, showlegend=col == 1, hovertext=hover, hoverinfo="text"), row=1, col=col)
            if knee is not None:
                fig.add_trace(go.Scatter(
                    x=[knee.probe.offered_rps], y=[getattr(knee.probe.measurement, figure).p95], mode="markers",
                    marker={"symbol": "star", "size": 20, "color": color, "line": {"width": 1.5, "color": "#222"}},
                    name=f"{name}: knee", legendgroup=name, showlegend=False,
                    hovertext=f"{name}: knee at {knee.probe.offered_rps:.3g} req/s, the highest load that passed",
                    hoverinfo="text"), row=1, col=col)
    for verdict, (symbol, color) in VERDICT_MARKERS.items():  # legend entries only
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=verdict.value,
                                 marker={"symbol": symbol, "size": 10, "color": color}), row=1, col=1)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=KNEE_NAME,
                             marker={"symbol": "star", "size": 16, "color": "#bbb", "line": {"width": 1.5,
                                                                                              "color": "#222"}}),
                  row=1, col=1)
    for col, figure, limit, label in panels:
        values = [v for _, probes in curves for j in probes if (v := getattr(j.probe.measurement, figure).p95) > 0]
        top = _latency_top(values, limit)
        if limit is not None:
            fig.add_hline(y=limit, line={"color": COLORS.limit, "dash": "dash"}, row=1, col=col)
        log = _fit_latency_axis(fig, values, top, row=1, col=col)
        if limit is not None:
            _label_limit(fig, limit, f"{b.name} boundary: {label} ≤ {limit:g} s", log, "" if col == 1 else "2")
        fig.update_yaxes(title_text=f"{label} (s)", row=1, col=col)
    fig.update_xaxes(title_text="offered load (req/s)", rangemode="tozero")
    _layout(fig, "Load curves: p95 latencies against the offered load, probe by probe<br><sup>each trial's probes "
                 f"on one engine launch; dashed: the {b.name} boundary's limits; star: the knee, the highest load "
                 "that passed</sup>", 560)
    # The figure's title above the panels' own, not over them.
    fig.update_layout(margin={"t": 110}, title={"yref": "container", "y": 0.95, "yanchor": "top"})
    return fig


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
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
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
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
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
    # lazy: keeps the CLI's start fast (plotly, for the HTML page only)
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
    _layout(fig, f"Replicas against traffic, each replica at {plan.headroom:.0%} of its capacity within the "
                 "boundary")
    return fig
