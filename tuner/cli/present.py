"""How the CLI states trials and recommendations to people: the one-line trial renderers, the recommendation
and its gain over vLLM's default configuration. (`--json` prints the answers' own data instead.)"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from tuner.analysis.capacity import JudgedProbe
from tuner.common.console import fmt, out
from tuner.describe import context_line, throughput_line
from tuner.common.durations import format_duration
from tuner.analysis.replicas import MeasuredCapacity, ReplicaCount
from tuner.analysis.scoring import Score, capacity_line
from tuner.study.recommendation import capacity_sentence, gain_sentence

if TYPE_CHECKING:
    from tuner.answers import (BaselineAnswer, BestSoFar, LimitingResourceAnswer, MeasuredCapacityAnswer, PlanAnswer,
                               ProbeLengthAnswer, RecommendationAnswer, ReplicaCountAnswer, ReportAnswer,
                               TrialRowAnswer)
    from tuner.analysis.scoring import Capacity
    from tuner.study.events import TrialSummary
    from tuner.workers.probes import Probe


def _role(s: TrialSummary) -> str:
    """` (baseline)`, ` (validation, round 2: trial 3)`, or nothing for a search trial."""
    mark = s.validation
    if mark is not None:
        what = "vLLM's default" if mark.default else f"trial {mark.of_trial}"
        return f" (validation, round {mark.round} of {mark.repeats}: {what})"
    return " (baseline)" if s.baseline else ""


def probe_length_line(length: ProbeLengthAnswer, request_timeout_s: float) -> str:
    """How long a new study's trials will replay, so that people can budget the machine's time before they run it:
    `each probe replays 100 requests over 5m22s of arrivals (0.311 req/s) at the reference load, ...`."""
    arrivals = (f"{length.requests} requests over {format_duration(length.arrival_s)} of arrivals "
                f"({length.offered_rps:.3g} req/s)")
    ends = f"ends within the request timeout ({format_duration(request_timeout_s)}) of its last arrival"
    if length.probes == 1:
        return f"each trial replays {arrivals} and {ends}"
    return (f"each probe replays {arrivals} at the reference load and at least "
            f"{format_duration(length.least_arrival_s)} of arrivals at any other, and {ends}; a trial runs up to "
            f"{length.probes} probes (a validation launch {2 * length.probes}): at least "
            f"{format_duration(length.trial_arrival_s)} of arrivals when it spends them, startup aside")


def summary_line(s: TrialSummary) -> str:
    """One line per finished trial of a run: `trial 3 (baseline): complete, 1.700 req/s, p95 e2e 2.10 s,
    feasible`, or its failure class and reason."""
    head = f"trial {s.number}{_role(s)}: {s.state}"
    score = s.score
    if score is not None:
        capacity = score.capacity
        carried = throughput_line(score.completed_rps, score.e2e_p95_s, capacity and capacity.rps, bool(capacity))
        head += (f", {carried}, "
                 f"{'feasible' if score.feasible else 'infeasible: ' + '; '.join(score.violations)}")
    elif s.failure_class:
        head += f" [{s.failure_class}] {s.reason}"
    elif s.reason:
        head += f": {s.reason}"
    return head


def best_so_far_line(best: BestSoFar) -> Text:
    """The best trial so far in one line: its throughput, latency and the context it was measured in."""
    capacity = best.capacity
    where = context_line(best.boundary_text, best.measured_on, best.vllm_version, best.trace.path, best.trace.sha256,
                         best.feasible)
    return Text(f"trial {best.trial}: "
                f"{throughput_line(best.completed_rps, best.e2e_p95_s, capacity and capacity.rps, bool(capacity))}; "
                f"{where}" + _limited_by(best.limiting_resource))


def _limited_by(held_by: LimitingResourceAnswer | None) -> str:
    """`; limited by <sentence>` for a trial whose limiting resource is known, else nothing."""
    return f"; limited by {held_by.sentence}" if held_by else ""


def default_line(base: BaselineAnswer) -> str:
    """vLLM's default configuration in one line: its trial and score (its capacity after a load search), or how
    it ended unscored."""
    score = base.scored
    if score is None:
        return f"trial {base.trial}: {base.state}" + (f" [{base.failure_class}]" if base.failure_class else "")
    capacity = score.capacity
    carried = throughput_line(score.completed_rps, score.e2e_p95_s, capacity and capacity.rps, bool(capacity))
    return (f"trial {base.trial}: {carried}, {'feasible' if score.feasible else 'infeasible'}"
            + _limited_by(base.limiting_resource))


def print_probe_ladder(judged: Sequence[JudgedProbe], capacity: Capacity, title: str = "load probes") -> None:
    """The probes of one trial, one row each, why each that did not pass did not, and the capacity."""
    table = Table(title=title)
    for column in ("probe", "offered req/s", "x reference", "completed", "p95 TTFT s", "p95 e2e s", "preemptions",
                   "waiting peak", "KV peak", "verdict"):
        table.add_column(column, justify="left" if column == "verdict" else "right")
    styles = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
    for j in judged:
        p, m = j.probe, j.probe.measurement
        verdict = Text(j.verdict.value, style=styles[j.verdict.value])
        if m is None:
            table.add_row(str(p.index + 1), "", f"{p.factor:.3g}", "", "", "", "", "", "", verdict)
            continue
        table.add_row(str(p.index + 1), fmt(m.offered_rps), f"{p.factor:.3g}", f"{m.completed}/{m.requests}",
                      fmt(m.ttft_s.p95), fmt(m.e2e_s.p95), str(m.preemptions), f"{m.waiting_peak:g}",
                      f"{m.kv_usage_peak:.0%}", verdict)
    out.print(table)
    for j in judged:
        for reason in j.reasons:
            out.print(f"probe {j.probe.index + 1}: {reason}", highlight=False, soft_wrap=True)
    if resumed := resumed_text([j.probe for j in judged]):
        out.print(resumed, highlight=False, soft_wrap=True)
    out.print(ladder_capacity_line(capacity), highlight=False, soft_wrap=True)


def resumed_text(probes: Sequence[Probe]) -> str | None:
    """`probes 1-2 measured by an earlier launch of this configuration, cut off before it ended (trial 0)`, for a
    trial that resumed after an earlier launch's probes; None for one that measured all of its own."""
    earlier = [p for p in probes if p.earlier_trial is not None]
    if not earlier:
        return None
    first, last = earlier[0].index + 1, earlier[-1].index + 1
    trials = sorted({p.earlier_trial for p in earlier if p.earlier_trial is not None})
    which = f"probe {first}" if first == last else f"probes {first}-{last}"
    by = f"trial {trials[0]}" if len(trials) == 1 else "trials " + ", ".join(map(str, trials))
    return f"{which} measured by an earlier launch of this configuration, cut off before it ended ({by})"


def ladder_capacity_line(capacity: Capacity) -> str:
    """`capacity: 3.4 req/s (x1.7 the trace's rate) within the boundary; <how the search ended>`, or that none
    was found and why."""
    carried = capacity_line(capacity)
    if carried is None:
        return f"capacity: none within the boundary ({capacity.ended})"
    return f"capacity: {carried} within the boundary; {capacity.ended}"


def report_trial_line(r: TrialRowAnswer) -> str:
    """One of the report's trial rows in one line: `  trial 2 (recommended): complete, 16/16 at 1.7 req/s, ...
    | settings | why`."""
    head = f"  trial {r.trial}" + (f" (attempt {r.attempt})" if r.attempt > 1 else "")
    head += f" ({', '.join(r.roles)})" if r.roles else ""
    what = r.state + (f" [{r.failure_class}]" if r.failure_class else "")
    if r.requests is not None:
        what += (f", {r.completed}/{r.requests} at {fmt(r.completed_rps)} req/s, p95 TTFT "
                 f"{fmt(r.ttft_p95_s)} s, p95 e2e {fmt(r.e2e_p95_s)} s, {r.preemptions} preemptions")
        if r.feasible is not None:
            what += ", within the boundary" if r.feasible else ""
    if r.capacity is not None:
        what += f", capacity {capacity_line(r.capacity) or 'none'}"
    if r.trace_fit is not None:
        what += f", {r.trace_fit.describe()}"
    if resumed := resumed_text([JudgedProbe.from_dict(p).probe for p in r.probes or []]):
        what += f", {resumed}"
    settings = ", ".join(f"{k}={v}" for k, v in r.settings.items()) or "vLLM defaults"
    held_by = r.limiting_resource
    return (f"{head}: {what} | {settings}" + (f" | limited by {held_by.sentence}" if held_by else "")
            + (f" | {r.why}" if r.why else ""))


def print_recommendation(rec: RecommendationAnswer) -> None:
    """The recommended `vllm serve` command with its boundary, machine, vLLM, trace and measurement, then the
    gain sentence."""
    # lazy: keeps the CLI's start fast (the answers' pydantic models)
    from tuner.answers import ScoreAnswer

    # The recommendation's records, as stored: the answer carries them in their stored shapes.
    m, score = rec.measurement, Score.from_dict(rec.score.to_dict())
    out.print(f"Recommended for the {rec.boundary_text} boundary (trial {rec.trial}):")
    out.print(f"  {rec.serve_command}", highlight=False, soft_wrap=True)
    if rec.numerics:
        out.print(Text(rec.numerics, style="bold"), highlight=False, soft_wrap=True)
    out.print(f"measured on {rec.measured_on}, vLLM {rec.vllm_version}, trace {Path(rec.trace.path).name} "
              f"(sha256 {rec.trace.sha256[:12]}, {m.requests} requests)")
    out.print(f"completed {m.completed}/{m.requests} at {score.completed_rps:.3f} req/s, "
              f"{score.output_tps:.1f} output tok/s, p95 TTFT {m.ttft_s.p95 or 0:.3f} s, "
              f"p95 e2e {score.e2e_p95_s:.3f} s, {m.preemptions} preemptions")
    if score.capacity is not None:
        # The same traffic for every trial of a study: the reference load is the recommendation's.
        traffic = m.offered_rps
        out.print(f"it {capacity_sentence(score, traffic)}", highlight=False, soft_wrap=True)
        if rec.shortfall:
            out.print(Text(rec.shortfall, style="bold"), highlight=False, soft_wrap=True)
        base = Score.from_dict(rec.baseline.scored.to_dict()) if rec.baseline and rec.baseline.scored else None
        if base is not None and base.capacity is not None and rec.baseline.trial != rec.trial:
            out.print(f"vLLM's default configuration (trial {rec.baseline.trial}) "
                      f"{capacity_sentence(base, traffic)}", highlight=False, soft_wrap=True)
    out.print(gain_sentence(rec.baseline, rec.validation.sentence if rec.validation else None, rec.trial),
              highlight=False, soft_wrap=True)
    own = rec.own_precision
    if own is not None:
        own_score = Score.from_dict(own.score.to_dict()) if isinstance(own.score, ScoreAnswer) else None
        carried = (f", it {capacity_sentence(own_score, m.offered_rps)}"
                   if own_score is not None and own_score.capacity is not None else "")
        out.print(f"at the model's own precision the best is trial {own.trial}{carried}; {own.gain}:",
                  highlight=False, soft_wrap=True)
        out.print(f"  {own.serve_command}", highlight=False, soft_wrap=True)
    if rec.spent is not None:
        out.print(f"spent {rec.spent.text}", highlight=False, soft_wrap=True)


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


def _capacity(c: MeasuredCapacityAnswer) -> MeasuredCapacity:
    return MeasuredCapacity(c.rps, c.low, c.high if c.high is not None else float("inf"), c.launches)


def _replicas(r: ReplicaCountAnswer) -> str:
    return ReplicaCount(r.low, r.high).text()


def _pair(pair: Sequence[float] | None, spec: str, unit: str = "") -> str:
    if not pair:
        return "-"
    low, high = (f"{unit}{v:{spec}}" for v in pair)
    return low if low == high else f"{low} to {high}"


def print_plan(plan: PlanAnswer) -> None:
    """`tuner study plan`: the traffic and the assumptions, then each configuration's capacity, replicas at the peak,
    its hours and cost a day, and whether a setting or another replica relieves it; the day hour by hour."""
    traffic = plan.traffic
    window = (f" (starting {traffic.peak.start_s:.0f} s into the trace at that rate)" if traffic.peak.window_s
              else "")
    out.print(f"study {plan.study}: peak {traffic.peak.rps:.3g} req/s from {traffic.peak_source}{window}",
              highlight=False)
    out.print(f"traffic: {traffic.trace}", highlight=False)
    out.print(f"day: {traffic.day_source}", highlight=False)
    out.print(f"assumed: each replica runs at {plan.headroom:.0%} of its capacity (--headroom); "
              f"{plan.unit}s per replica: its tensor_parallel_size"
              + (f"; ${plan.gpu_hour_usd:g} per {plan.unit}-hour" if plan.gpu_hour_usd else ""), highlight=False)
    for note in plan.notes:
        out.print(f"note: {note}", highlight=False)
    table = Table("configuration", "capacity within the boundary", "replicas at the peak", f"{plan.unit}-hours a day",
                  "cost a day", "per 1M output tokens", "setting or replica?")
    for c in plan.configurations:
        capacity = (f"{_capacity(c.capacity).text()}\n{c.capacity_source}" if c.capacity is not None
                    else c.capacity_source)
        day = c.day
        table.add_row(f"trial {c.trial} ({c.role})", capacity,
                      _replicas(c.peak_replicas) if c.peak_replicas else "-",
                      _pair(day.slot_hours, ".0f") if day else "-",
                      _pair(day.cost_usd, ",.2f", "$") if day else "-",
                      _pair(day.cost_per_million_tokens_usd, ",.2f", "$") if day else "-", c.remedy)
    out.print(table)
    planned = [c for c in plan.configurations if c.day is not None]
    if traffic.hourly_rps and planned:
        hours = Table("hour", "req/s", *(f"trial {c.trial}" for c in planned), title="replicas hour by hour")
        for hour, rate in enumerate(traffic.hourly_rps):
            hours.add_row(str(hour), f"{rate:.3g}", *(_replicas(c.day.replicas[hour]) for c in planned))
        out.print(hours)
