"""What every figure of the report shares: its colours, one per role of a trial and per kind of point or bar, its
layout, and plainly labelled log ticks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.report.data import ReportData
from tuner.storage import StoredTrial

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


def role_color(role: str) -> str:
    """The colour of a trial's role: the recommendation's, else the default's."""
    return COLORS.recommended if "recommended" in role else COLORS.default


def layout(fig: Figure, title: str, height: int = 480) -> None:
    """Every figure's title, height, template, margins and legend below."""
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      margin={"l": 70, "r": 40, "t": 80, "b": 60},
                      legend={"orientation": "h", "yanchor": "bottom", "y": -0.32, "x": 0})


def log_ticks(low: float, high: float) -> dict:
    """1-2-5 ticks for a log axis, labelled plainly (plotly's own crowd the axis with minor digits)."""
    ticks = [m * 10.0 ** e for e in range(-4, 10) for m in (1, 2, 5) if low <= m * 10.0 ** e <= high]
    return {"tickvals": ticks, "ticktext": [f"{v:,.0f}" if v >= 1 else f"{v:g}" for v in ticks]}


def trial_label(data: ReportData, t: StoredTrial) -> str:
    """`trial 3 (recommended)`: the trial's number and its roles in the report, the Pareto front's aside."""
    roles = [r for r in data.roles(t) if r != "Pareto"]
    return f"trial {t.trial_number}" + (f" ({', '.join(roles)})" if roles else "")
