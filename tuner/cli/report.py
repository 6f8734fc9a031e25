"""`tuner study report` and `tuner compare`: reports people read, from a study or from one dimension varied."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from tuner.cli.options import (ArtifactsOption, BoundaryOption, CapOption, EngineArgOption, FitOption, FormatOption,
                               JsonOption, LimitOption, LoadOption, LoadRangeOption, PrecisionOption,
                               ProbeBudgetOption, ProbeRequestsOption, ProbeSecondsOption, PromptSeedOption,
                               RateOption, ReplayedTraceOption, RequestTimeoutOption, ServedModelOption, ServerOption,
                               SpreadOption, StartupTimeoutOption, StorageOption, StudyArgument, TokenFileOption,
                               WindowOption, load_policy, study_answers, trace_selection)
from tuner.cli.present import ladder_capacity_line, print_probe_ladder, print_report_lines, report_trial_line
from tuner.common.console import err, fmt, out, print_json, progress_bar
from tuner.describe import boundary_line
from tuner.common.errors import TunerError
from tuner.common.models import default_model
from tuner.common.paths import bundled_trace
from tuner.analysis.scoring import capacity_line, parse_limits
from tuner.analysis.scoring import boundary as make_boundary
from tuner.workers.engine_config import EngineConfig

if TYPE_CHECKING:
    from tuner.compare import CompareResult, CompareRun

COMPARE_FILE = "compare.json"  # the whole comparison, as --json prints it, in the --out folder


# --- tuner study report ----------------------------------------------------------------------------------


def study_report(
    name: StudyArgument,
    html: Annotated[Optional[Path], typer.Option("--html", help="Write the report as one self-contained HTML "
                                                                "page (plots included, no network needed).")] = None,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
    server: ServerOption = None, token_file: TokenFileOption = None,
) -> None:
    """The study's report: the recommendation, vLLM's default beside it, and every trial.

    The recommendation is stated with its boundary, machine, trace and vLLM version. --html writes the page
    with the plots: Pareto front, preemptions, queue against inference, timelines, output lengths."""
    studies = study_answers(server, token_file, storage, artifacts)
    view = studies.report(name)
    written = None
    if html is not None:
        if html.is_dir():
            raise TunerError(f"{html} is a folder: give the HTML file to write")
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(studies.report_html(name), encoding="utf-8")
        written = html
    if as_json:
        return print_json({**view.summary.to_dict(), "html": str(written) if written else None})
    print_report_lines(view)
    base, rec = view.baseline_trial, view.recommended_trial
    table = Table("", f"vLLM default (trial {base})" if base is not None else "vLLM default",
                  f"recommended (trial {rec})" if rec is not None else "recommended", "change",
                  title="default and recommendation, side by side")
    for row in view.side_by_side:
        table.add_row(*row)
    out.print(table)
    # One line per trial rather than a wide table: it reads the same at any terminal width.
    out.print(Text(f"every trial of study {name}", style="bold"))
    shared = ", ".join(f"{k}={v}" for k, v in view.common_settings.items())
    if shared:
        out.print(f"  all had: {shared}", highlight=False, soft_wrap=True)
    for r in view.trial_rows:
        out.print(report_trial_line(r), highlight=False, soft_wrap=True)
    if written is not None:
        out.print(f"report written to {written}")


# --- tuner compare ---------------------------------------------------------------------------------------


def _compare_rows(result: CompareResult) -> list[tuple[str | Text, list]]:
    """(what, one cell per value) rows of the side-by-side table: after a load search, each value's capacity
    first, then what its probe at the reference load measured."""

    def cells(fn) -> list[str]:
        out = []
        for run in result.runs:
            m = run.measurement
            out.append("-" if m is None else fn(m))
        return out

    rows: list[tuple[str | Text, list]] = [
        ("state", [("ok" if run.served else Text(str(run.failure_class), style="red")) for run in result.runs])]
    searched = result.policy.mode == "search"
    if searched:
        rows += [
            ("capacity req/s (x the trace's rate)",
             ["-" if run.capacity is None else capacity_line(run.capacity) or Text("none", style="red")
              for run in result.runs]),
            ("how the search ended", ["-" if run.capacity is None else run.capacity.ended for run in result.runs]),
            ("probes", [str(len(run.probes)) for run in result.runs]),
            (Text("at the reference load", style="bold"), ["" for _ in result.runs]),
        ]
    rows += [
        ("preemptions", cells(lambda m: f"{m.preemptions} ({m.preemptions_per_100:.1f} per 100)")),
        ("completed / requests", cells(lambda m: f"{m.completed} / {m.requests}")),
        ("TTFT p50 / p95 s", cells(lambda m: f"{fmt(m.ttft_s.p50)} / {fmt(m.ttft_s.p95)}")),
        ("total response (e2e) p50 / p95 s", cells(lambda m: f"{fmt(m.e2e_s.p50)} / {fmt(m.e2e_s.p95)}")),
        ("queue time mean / p95 s (vLLM)", cells(lambda m: f"{fmt(m.queue_s_mean)} / {fmt(m.queue_s_p95)}")),
        ("inference time mean s (vLLM)", cells(lambda m: fmt(m.inference_s_mean))),
        ("completed req/s", cells(lambda m: fmt(m.completed_rps))),
        ("output tok/s", cells(lambda m: fmt(m.output_tps, 1))),
        ("running / waiting peak", cells(lambda m: f"{m.running_peak:g} / {m.waiting_peak:g}")),
        ("KV usage peak", cells(lambda m: f"{m.kv_usage_peak:.0%}")),
    ]
    if result.boundary is not None:
        rows.append((f"meets the {result.boundary.name} boundary" + (" there" if searched else ""),
                     [("-" if run.score is None else "yes" if run.score.feasible
                       else "no: " + "; ".join(run.score.violations)) for run in result.runs]))
    return rows


def _run_dict(run: CompareRun) -> dict:
    """One run as `--json` prints it and compare.json keeps it: its record, measurement (at the reference load),
    score, and after a load search its judged probes and capacity."""
    record = run.record
    return {"label": run.label, "value": run.value, "served": run.served, "failure_class": run.failure_class,
            "failure": run.failure, "out_dir": str(run.out_dir) if run.out_dir else None,
            "engine_config": record.engine_config.to_dict() if record else None,
            "serve_command": record.serve_command if record else None,
            "trace": asdict(record.trace) if record else None,
            "measurement": run.measurement.to_dict() if run.measurement else None,
            "score": run.score.to_dict() if run.score else None,
            "probes": [j.to_dict() for j in run.probes],
            "capacity": run.capacity.to_dict() if run.capacity else None}


def compare(
    vary: Annotated[str, typer.Option(help="The one dimension to vary, NAME=V1,V2[,...]: an engine setting "
                                           "(max_num_seqs=64,256), a trace dimension, a factor on the trace "
                                           "as selected: rate_scale (arrival rate), output_scale (every "
                                           "request's output tokens), input_scale (input tokens), or "
                                           "arrivals=recorded,spread (the same requests, each recorded "
                                           "instant's spread up to the next: --spread).")],
    model: ServedModelOption = None, trace: ReplayedTraceOption = None,
    set_: Annotated[list[str], typer.Option("--set", help="Engine setting NAME=VALUE held for every value "
                                                          "(repeatable).")] = [],
    engine_arg: EngineArgOption = [],
    format: FormatOption = None, window: WindowOption = None, rate_scale: RateOption = None,
    max_requests: CapOption = None, fit: FitOption = None, spread: SpreadOption = False,
    boundary: BoundaryOption = "interactive", limit: LimitOption = [],
    load: LoadOption = "search", precision: PrecisionOption = 0.1, probe_budget: ProbeBudgetOption = 6,
    load_range: LoadRangeOption = None, probe_requests: ProbeRequestsOption = 100,
    probe_seconds: ProbeSecondsOption = 20.0,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Folder for each value's log and records.")] = None,
    startup_timeout: StartupTimeoutOption = 600.0, request_timeout: RequestTimeoutOption = 600.0,
    seed: PromptSeedOption = 0,
    as_json: JsonOption = False,
) -> None:
    """One dimension at a time: the same trace at each value, side by side, with a plain verdict.

    Everything else is held equal. By default each value's trial searches its capacity, the highest load that
    passes the boundary; its probe ladder is printed and the verdict says which value carries more (about the
    same within the search's precision). With --load fixed each value is replayed once and the verdict says what
    the change did to preemptions, completed requests, total response time and queue time."""
    # lazy: keeps the CLI's start fast (tuner.compare: ~8 ms)
    from tuner.compare import parse_vary, run_compare

    base = EngineConfig.from_assignments(set_)
    variation = parse_vary(vary, base, spread)
    bound = make_boundary(boundary, parse_limits(limit))
    policy = load_policy(load, precision, probe_budget, load_range, probe_requests, probe_seconds)
    searched = policy.mode == "search"
    selection = trace_selection(window, max_requests, rate_scale, fit, spread)
    model = model or default_model()
    trace = trace or bundled_trace()
    out_dir = out_dir or Path("runs") / datetime.now().strftime("compare-%Y%m%d-%H%M%S")
    with progress_bar(as_json) as progress:
        task = progress.add_task("preparing", total=None)
        state = {"label": ""}

        def on_start(i: int, label: str, requests: int) -> None:
            state["label"] = f"{label} ({i + 1}/{len(variation.values)})"
            # A search's probes hold more requests than the trace, and how many probes is not known yet.
            progress.update(task, description=state["label"], completed=0, total=None if searched else requests)

        def on_run(run: CompareRun) -> None:
            if not as_json and run.capacity is not None:
                err.print(f"{run.label}: {ladder_capacity_line(run.capacity)}", highlight=False)
            elif not as_json:
                m = run.measurement
                what = (f"{m.completed}/{m.requests} completed, {m.preemptions} preemptions, p95 e2e "
                        f"{fmt(m.e2e_s.p95)} s" if run.served else (str(run.failure), "red"))
                err.print(Text.assemble(f"{run.label}: ", what), highlight=False)

        result = run_compare(model=model, trace_path=trace, selection=selection, variation=variation,
                             base_config=base, out_dir=out_dir, boundary=bound, policy=policy, format=format,
                             startup_timeout_s=startup_timeout, request_timeout_s=request_timeout,
                             extra_args=tuple(engine_arg), seed=seed, on_start=on_start,
                             on_phase=lambda p: progress.update(task, description=f"{state['label']}: {p}"),
                             on_request_done=lambda _: progress.advance(task), on_run=on_run)
    records = [r.record for r in result.runs if r.record is not None]
    first = records[0]
    machine = {"hardware": first.hardware.to_dict(), "description": first.hardware.describe(),
               "vllm_version": first.vllm_version}
    summary = {"dimension": variation.name, "kind": variation.kind, "values": list(variation.values),
               "fixed": base.to_dict(), "model": str(model), "boundary": bound.to_dict(), "load": policy.to_dict(),
               "boundary_text": boundary_line(bound), "measured_on": machine,
               "runs": [_run_dict(r) for r in result.runs], "verdicts": result.verdicts, "out_dir": str(out_dir)}
    # Kept beside the runs' records, so the comparison can be read again without re-running it.
    (out_dir / COMPARE_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if as_json:
        print_json(summary)
    else:
        for run in result.runs:
            if run.capacity is not None:
                print_probe_ladder(run.probes, run.capacity, title=f"{run.label}: load probes")
        table = Table("", *(r.label for r in result.runs), title=f"{variation.name}, one value at a time")
        for what, cells in _compare_rows(result):
            table.add_row(what, *cells)
        out.print(table)
        out.print(Text("Verdict", style="bold"))
        for line in result.verdicts:
            out.print(f"  {line}", highlight=False, soft_wrap=True)
        t = first.trace
        out.print(f"measured on {machine['description']}, vLLM {machine['vllm_version']}, trace {t.source} "
                  f"(sha256 {t.sha256[:12]}, {t.requests} requests, {t.span_s:.1f} s)", highlight=False,
                  soft_wrap=True)
        out.print(f"held for every value: {', '.join(f'{k}={v}' for k, v in base.to_dict().items()) or 'vLLM defaults'}"
                  f"; judged against the {boundary_line(bound)} boundary", highlight=False, soft_wrap=True)
        if searched:
            out.print(f"capacity: the highest load each value passed the boundary at, searched to within "
                      f"{policy.precision:.0%} in at most {policy.probe_budget} probes of at least "
                      f"{policy.probe_requests} requests over {policy.probe_seconds:g} s; the reference load is the "
                      f"trace at its selected rate",
                      highlight=False, soft_wrap=True)
        out.print(f"records: {out_dir}/{COMPARE_FILE}, {out_dir}/<value>/measurement.json, requests.csv, server.log",
                  highlight=False)
    if not any(r.served for r in result.runs):
        raise typer.Exit(1)
