"""The study report: one self-contained HTML page people read, and the same summary for the terminal.

What is on it: the Pareto front of completed throughput against p95 end-to-end latency with the boundary
drawn; each trial's load curve when the study searched its load (p95 TTFT and end-to-end against the offered
load, the boundary's limits, the knee at its capacity); vLLM's default configuration and the recommendation
side by side; every trial with its failure class and, after a load search, its capacity; preemptions against
max_num_seqs and the KV budget; where the time went (vLLM's queue and inference histograms); the running,
waiting and KV-usage timelines of the default and the recommended trial; requested against served output
lengths. Every recommendation is stated with the boundary it meets, the machine it was measured on, the trace
and the vLLM version.

One job per module: `data` reads the study from storage into a `ReportData`; `content` turns it into typed
rows and sentences (and `summary`, their JSON); `figures` draws the plots; `page` renders the HTML page from
the Jinja2 template in templates/.
"""

from tuner.report.content import (MachineGroup, SideBySideRow, TrialRow, common_settings, recommendation_lines,
                                  side_by_side, summary, trial_rows)
from tuner.report.data import ReportData, collect_report, kv_budget_tokens, read_timeline
from tuner.report.figures import load_curve_figure, pareto_figure
from tuner.report.page import NO_TIMELINE, render_html

__all__ = [
    "NO_TIMELINE", "MachineGroup", "ReportData", "SideBySideRow", "TrialRow", "collect_report", "common_settings",
    "kv_budget_tokens", "load_curve_figure", "pareto_figure", "read_timeline", "recommendation_lines", "render_html",
    "side_by_side", "summary", "trial_rows",
]
