"""`tuner trial ...`: one engine configuration, launched and measured."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from tuner.analysis.capacity import JudgedProbe, capacity_of
from tuner.cli.options import (BoundaryOption, CapOption, EngineArgOption, FitOption, FormatOption, LimitOption,
                               LoadOption, LoadRangeOption, PrecisionOption, ProbeBudgetOption, ProbeRequestsOption,
                               ProbeSecondsOption, PromptSeedOption, RateOption, ReplayedTraceOption,
                               RequestTimeoutOption, ServedModelOption, SetOption, SpreadOption, StartupTimeoutOption,
                               WindowOption, load_policy, trace_selection)
from tuner.cli.present import print_probe_ladder
from tuner.common.console import fmt, out, print_json, progress_bar
from tuner.analysis.diagnosis import EngineCaps, limiting_resource
from tuner.common.models import default_model, inspect_model
from tuner.common.paths import bundled_trace
from tuner.analysis.scoring import parse_limits
from tuner.analysis.scoring import boundary as named_boundary
from tuner.traces.selection import load_trace
from tuner.workers.engine_config import EngineConfig
from tuner.workers.trial import TrialSpec, run_trial

trial_app = typer.Typer(help="One engine configuration, launched and measured.", no_args_is_help=True)


# Where a trial's queue figures came from (Measurement.queue_source), as its table says it.
_QUEUE_SOURCES = {"per_request": "  (each request's own, from vLLM)",
                  "histogram": "  (vLLM's histogram, interpolated in its buckets)"}


def _trial_table(record) -> Table:
    m = record.measurement
    table = Table(title="trial", show_header=False)
    table.add_row("command", Text(record.serve_command))
    table.add_row("hardware", record.hardware.describe())
    table.add_row("vLLM", record.vllm_version)
    trace = record.trace
    table.add_row("trace", Text(f"{trace.source} ({trace.requests} requests, {trace.span_s:.1f} s)"))
    for step in trace.transformations:
        table.add_row("", step)
    t = record.timings
    table.add_row("time", f"startup {t.startup_s:.1f} s (compile cache {t.compile_cache.value}), "
                          f"replay {t.replay_s:.1f} s, teardown {t.teardown_s:.1f} s")
    if record.failure is not None:
        f = record.failure
        table.add_row(Text("failure", style="red"), Text.assemble((f.kind.value, "red"), f": {f.message}"))
        if f.estimated_max_model_len is not None:
            table.add_row("estimated max model len", str(f.estimated_max_model_len))
    if m is not None:
        table.add_row("completed / requests", f"{m.completed} / {m.requests}  {m.outcomes}")
        table.add_row("completed req/s", fmt(m.completed_rps))
        table.add_row("output tok/s", fmt(m.output_tps, 1))
        table.add_row("TTFT p50 / p95 / p99 s", " / ".join(fmt(v) for v in (m.ttft_s.p50, m.ttft_s.p95, m.ttft_s.p99)))
        table.add_row("e2e p50 / p95 / p99 s", " / ".join(fmt(v) for v in (m.e2e_s.p50, m.e2e_s.p95, m.e2e_s.p99)))
        table.add_row("queue p50 / p95 s", f"{fmt(m.queue_s_p50)} / {fmt(m.queue_s_p95)}"
                      + _QUEUE_SOURCES.get(m.queue_source, ""))
        table.add_row("preemptions", f"{m.preemptions} ({m.preemptions_per_100:.1f} per 100 requests)")
        table.add_row("running peak / mean", f"{m.running_peak:g} / {m.running_mean:.1f}")
        table.add_row("waiting peak / mean", f"{m.waiting_peak:g} / {m.waiting_mean:.1f}")
        table.add_row("KV usage peak", f"{m.kv_usage_peak:.1%}")
        if m.metrics_unreported:
            table.add_row(Text("not reported by vLLM", style="red"),
                          f"{', '.join(m.metrics_unreported)}: read as 0 above")
        table.add_row("output tokens requested / actual", f"{m.requested_output_tokens} / {m.actual_output_tokens}")
        table.add_row("send lateness p99 ms", fmt((m.send_lateness_s.p99 or 0) * 1000, 2))
    table.add_row("server log", Text(record.log_path))
    return table


@trial_app.command("run")
def trial_run(
    model: ServedModelOption = None, trace: ReplayedTraceOption = None, set_: SetOption = [],
    engine_arg: EngineArgOption = [],
    format: FormatOption = None, window: WindowOption = None, rate_scale: RateOption = None,
    max_requests: CapOption = None, fit: FitOption = None, spread: SpreadOption = False,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Folder for the log and records.")] = None,
    startup_timeout: StartupTimeoutOption = 600.0, request_timeout: RequestTimeoutOption = 600.0,
    seed: PromptSeedOption = 0,
    boundary: BoundaryOption = "interactive",
    limit: LimitOption = [],
    load: LoadOption = "search", precision: PrecisionOption = 0.1, probe_budget: ProbeBudgetOption = 6,
    load_range: LoadRangeOption = None, probe_requests: ProbeRequestsOption = 80,
    probe_seconds: ProbeSecondsOption = 20.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
) -> None:
    """Launch vLLM with one configuration and replay the trace open-loop against it: at several loads, to find
    the highest that passes the boundary (its capacity), or once at the reference load (--load fixed). Prints
    what users experienced at each."""
    bound = named_boundary(boundary, parse_limits(limit))
    policy = load_policy(load, precision, probe_budget, load_range, probe_requests, probe_seconds)
    config = EngineConfig.from_assignments(set_)
    model = model or default_model()
    trace = trace or bundled_trace()
    info = inspect_model(model)
    loaded = load_trace(trace, trace_selection(window, max_requests, rate_scale, fit, spread),
                        config.max_model_len or info.max_position_embeddings, format)
    policy.refuse_undecidable(bound, len(loaded.requests), loaded.span_s)
    out_dir = out_dir or Path("runs") / datetime.now().strftime("trial-%Y%m%d-%H%M%S")
    spec = TrialSpec(model=model, trace=loaded, config=config, out_dir=out_dir, startup_timeout_s=startup_timeout,
                     request_timeout_s=request_timeout, extra_args=tuple(engine_arg), seed=seed,
                     load=policy.plan(bound, below_reference=True))
    with progress_bar(as_json) as progress:
        task = progress.add_task("preparing", total=None)
        outcome = run_trial(spec, on_phase=lambda p: progress.update(task, description=p),
                            on_request_done=lambda _: progress.advance(task))
    record = outcome.record
    judged = [JudgedProbe.of(run, bound) for run in outcome.probes]
    capacity = (capacity_of(judged, policy, rate_scale or 1.0)
                if policy.mode == "search" and judged else None)
    held_by = limiting_resource(judged if capacity is not None else [], record.measurement,
                                EngineCaps.of(config.to_dict(), record.hardware), bound=bound)
    if as_json:
        print_json({**record.to_dict(), "boundary": bound.to_dict(), "probes": [j.to_dict() for j in judged],
                    "capacity": capacity.to_dict() if capacity else None,
                    "limiting_resource": held_by.to_dict() if held_by else None})
    else:
        out.print(_trial_table(record))
        if capacity is not None:
            print_probe_ladder(judged, capacity)
        if held_by is not None:
            out.print(f"limited by {held_by.sentence}")
        out.print(f"records: {out_dir}/measurement.json, {out_dir}/requests.csv")
    if record.failure is not None:
        raise typer.Exit(1)
