"""The report's figures of what each trial carried, built from a `ReportData`: the Pareto front with the boundary
drawn, and each trial's load curve (p95 latencies against the offered load, the knee marked); the figures of where
its time and memory went are in `run_figures`.

Each builder returns a plotly Figure, or None when the study has nothing to draw in it.
"""

from __future__ import annotations

import math
from itertools import cycle
from typing import TYPE_CHECKING

import optuna

from tuner.analysis.capacity import JudgedProbe, Verdict
from tuner.report.data import ReportData, pareto_study, quiet_optuna
from tuner.report.figure_style import COLORS, layout, log_ticks, role_color, trial_label
from tuner.analysis.scoring import Boundary, Capacity
from tuner.storage import StoredTrial

if TYPE_CHECKING:
    from plotly.graph_objects import Figure


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
    layout(fig, f"Pareto front: {against}<br><sup>{b.name} "
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
        fig.update_yaxes(type="log", range=[math.log10(low), math.log10(top)], **log_ticks(low, top), **where)
    else:
        fig.update_yaxes(range=[0, top], **where)
    return log


def _label_limit(fig: Figure, limit: float, text: str, log: bool, axis: str = "") -> None:
    """Write `text` above the line of a limit, at the left of the plot whose axes end in `axis` ("" or "2")."""
    # Placed by hand: on a log axis an annotation's y is in log10 units.
    fig.add_annotation(x=0, xref=f"x{axis} domain", y=math.log10(limit) if log else limit, yref=f"y{axis}",
                       text=text, showarrow=False, xanchor="left", yanchor="bottom", font={"color": COLORS.limit})


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
        color = role_color(roles) if roles else next(others)
        name = trial_label(data, t)
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
    layout(fig, "Load curves: p95 latencies against the offered load, probe by probe<br><sup>each trial's probes "
                f"on one engine launch; dashed: the {b.name} boundary's limits; star: the knee, the highest load "
                "that passed</sup>", 560)
    # The figure's title above the panels' own, not over them.
    fig.update_layout(margin={"t": 110}, title={"yref": "container", "y": 0.95, "yanchor": "top"})
    return fig
