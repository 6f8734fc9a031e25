"""How the CLI states trials and recommendations to people: the one-line trial renderers, the recommendation
and its gain over vLLM's default configuration. (`--json` prints the answers' own data instead.)"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from tuner.console import fmt, out
from tuner.describe import context_line, throughput_line

if TYPE_CHECKING:
    from tuner.studies import BestSoFar, RecommendationAnswer, ReportAnswer
    from tuner.study.events import TrialSummary


def summary_line(s: TrialSummary) -> str:
    """One line per finished trial of a run: `trial 3 (baseline): complete, 1.700 req/s, p95 e2e 2.10 s,
    feasible`, or its failure class and reason."""
    head = f"trial {s.number}{' (baseline)' if s.baseline else ''}: {s.state}"
    score = s.score
    if score is not None:
        head += (f", {throughput_line(score.completed_rps, score.e2e_p95_s)}, "
                 f"{'feasible' if score.feasible else 'infeasible: ' + '; '.join(score.violations)}")
    elif s.failure_class:
        head += f" [{s.failure_class}] {s.reason}"
    elif s.reason:
        head += f": {s.reason}"
    return head


def best_so_far_line(best: BestSoFar) -> Text:
    """The best trial so far in one line: its throughput, latency and the context it was measured in."""
    return Text(f"trial {best.trial}: {throughput_line(best.completed_rps, best.e2e_p95_s)}; "
                f"{context_line(best.to_dict())}")


def report_trial_line(r: dict) -> str:
    """One of the report's trial rows in one line: `  trial 2 (recommended): complete, 16/16 at 1.7 req/s, ...
    | settings | why`."""
    head = f"  trial {r['trial']}" + (f" (attempt {r['attempt']})" if r["attempt"] > 1 else "")
    head += f" ({', '.join(r['roles'])})" if r["roles"] else ""
    what = r["state"] + (f" [{r['failure_class']}]" if r["failure_class"] else "")
    if r["requests"] is not None:
        what += (f", {r['completed']}/{r['requests']} at {fmt(r['completed_rps'])} req/s, p95 TTFT "
                 f"{fmt(r['ttft_p95_s'])} s, p95 e2e {fmt(r['e2e_p95_s'])} s, {r['preemptions']} preemptions")
        if r["feasible"] is not None:
            what += ", within the boundary" if r["feasible"] else ""
    settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "vLLM defaults"
    return f"{head}: {what} | {settings}" + (f" | {r['why']}" if r["why"] else "")


def print_recommendation(rec: RecommendationAnswer) -> None:
    """The recommended `vllm serve` command with its boundary, machine, vLLM, trace and measurement, then the
    gain sentence."""
    from tuner.scoring import Score

    # The recommendation's records, as stored: the answer carries them in their stored shapes.
    m, score = rec.measurement, Score.from_dict(rec.score)
    out.print(f"Recommended for the {rec.boundary_text} boundary (trial {rec.trial}):")
    out.print(f"  {rec.serve_command}", highlight=False, soft_wrap=True)
    out.print(f"measured on {rec.measured_on}, vLLM {rec.vllm_version}, trace {Path(rec.trace['path']).name} "
              f"(sha256 {rec.trace['sha256'][:12]}, {m['requests']} requests)")
    out.print(f"completed {m['completed']}/{m['requests']} at {score.completed_rps:.3f} req/s, "
              f"{score.output_tps:.1f} output tok/s, p95 TTFT {m['ttft_s']['p95'] or 0:.3f} s, "
              f"p95 e2e {score.e2e_p95_s:.3f} s, {m['preemptions']} preemptions")
    out.print(gain_sentence(rec))


def gain_sentence(rec: RecommendationAnswer) -> str:
    """The recommendation against vLLM's default configuration: the throughput and p95 latency ratios, or why
    there is nothing to compare."""
    base, gain = rec.baseline, rec.gain
    if base is None:
        return "vLLM's default configuration was not run in this study"
    if gain is None:
        why = base["failure_class"] or ("infeasible" if base["state"] == "complete" else base["state"])
        return f"vLLM's default configuration (trial {base['trial']}) gave no score to compare: {why}"
    return (f"against vLLM's default configuration (trial {base['trial']}): completed throughput "
            f"x{gain['completed_rps_ratio']:.2f}, p95 e2e x{gain['e2e_p95_ratio']:.2f}"
            f"{'' if base['score'].get('feasible') else ' (the default broke the boundary)'}")


def print_report_lines(view: ReportAnswer) -> None:
    """The report's sentences: the recommendation (bold, its command indented) or why there is none (red),
    then the rest, each whole."""
    lines = view.lines
    # soft_wrap: a recommendation is read and copied whole, never broken at the terminal's width.
    out.print(Text(lines[0], style="bold" if view.recommended else "red"), highlight=False, soft_wrap=True)
    if view.recommended:
        out.print(f"  {lines[1]}", highlight=False, soft_wrap=True)
        rest = lines[2:]
    else:
        rest = lines[1:]
    for line in rest:
        out.print(line, highlight=False, soft_wrap=True)
