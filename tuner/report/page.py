"""The report as one self-contained HTML page, rendered from templates/report.html.j2 with autoescape on.

The page embeds plotly.js: it opens without a network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from tuner.describe import boundary_line
from tuner.report.content import (common_settings, measured_on, number_text, recommendation_lines, side_by_side,
                                  trace_line, trial_count_line, trial_rows)
from tuner.report.data import ReportData, config_text
from tuner.report.figures import load_curve_figure, pareto_figure
from tuner.report.run_figures import (output_lengths_figure, preemption_figure, replicas_figure, time_split_figure,
                                      timeline_figure)

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

NO_TIMELINE = "no timeline recorded"

_TEMPLATES = Environment(loader=PackageLoader("tuner.report"), autoescape=True, trim_blocks=True,
                         lstrip_blocks=True, undefined=StrictUndefined)
_TEMPLATES.filters["number"] = number_text
_TEMPLATES.filters["config_text"] = config_text


class _Plots(NamedTuple):
    """Each plot's HTML, None where the study has nothing to draw in it."""

    pareto: Markup | None
    load_curves: Markup | None  # None in a study at a fixed load: the page then leaves the section out
    preemptions: Markup | None
    time_split: Markup | None
    timelines: Markup | None
    output_lengths: Markup | None
    replicas: Markup | None  # None without a capacity plan: the page then leaves the section out


def _plot_html(fig: Figure | None, key: str) -> Markup | None:
    if fig is None:
        return None
    html = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{key}", default_width="100%",
                       config={"displaylogo": False, "responsive": True})
    # Safe as it is: plotly writes a div and the script that draws it, with the figure's text JSON-encoded
    # inside the script; HTML-escaping it would break the script.
    return Markup(html)


def render_html(data: ReportData) -> str:
    """The whole page, plotly.js inlined: it needs nothing from the network. Every text from the study is
    escaped by the template; only plotly's own HTML and script go in as they are."""
    # lazy: keeps the CLI's start fast (plotly)
    from plotly.offline import get_plotlyjs

    base, rec = data.baseline, data.recommended
    shared = common_settings(data)
    plots = _Plots(pareto=_plot_html(pareto_figure(data), "pareto"),
                   load_curves=_plot_html(load_curve_figure(data), "load_curves"),
                   preemptions=_plot_html(preemption_figure(data), "preemptions"),
                   time_split=_plot_html(time_split_figure(data), "time_split"),
                   timelines=_plot_html(timeline_figure(data), "timelines"),
                   output_lengths=_plot_html(output_lengths_figure(data), "output_lengths"),
                   replicas=_plot_html(replicas_figure(data), "replicas"))
    missing = [f"{role} (trial {t.trial_number})" for role, t in data.featured if t.trial_number not in data.timelines]
    return _TEMPLATES.get_template("report.html.j2").render(
        settings=data.settings, generated_at=data.generated_at, boundary_text=boundary_line(data.boundary),
        trace_text=trace_line(data.settings), machines=measured_on(data), recommended=rec is not None,
        recommendation_lines=recommendation_lines(data), trial_count=trial_count_line(data),
        default_heading=f"vLLM default (trial {base.trial_number})" if base else "vLLM default",
        recommended_heading=f"recommended (trial {rec.trial_number})" if rec else "recommended",
        side_by_side=side_by_side(data),
        serve_commands=[(role, t.serve_command) for role, t in (("vLLM default", base), ("recommended", rec))
                        if t is not None],
        shared_settings=config_text(shared) if shared else None, trial_rows=trial_rows(data), plots=plots,
        searched=data.searched,
        no_timeline=NO_TIMELINE, timeline_note=f"{NO_TIMELINE} for {', '.join(missing)}" if missing else None,
        # plotly.js itself, inlined as it is: escaping would break the script.
        plotly_js=Markup(get_plotlyjs()))
