"""`tuner study ...`: the lifecycle of a study, from the command line (`tuner study run` is in `run`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from tuner.cli.options import (BOUNDARY_HELP, ArtifactsOption, JsonOption, LimitOption, LoadOption, LoadRangeOption,
                               ModelOption, ProbeBudgetOption, ProbeRequestsOption, RequestTimeoutOption, ServerOption,
                               SetOption, SpreadOption, StartupTimeoutOption, StorageOption, StudyArgument,
                               TokenFileOption, study_answers)
from tuner.cli.present import best_so_far_line, default_line, print_plan, print_recommendation, probe_length_line
from tuner.cli.run import study_run, study_validate
from tuner.common.console import err, out, print_json
from tuner.common.durations import parse_duration
from tuner.common.errors import TunerError
from tuner.analysis.replicas import read_hourly_rates

study_app = typer.Typer(help="Studies: a search over engine configurations, measured trial by trial.",
                        no_args_is_help=True)


@study_app.command("create")
def study_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A name for the study.")],
    model: ModelOption = None,
    trace: Annotated[Optional[Path], typer.Option(help="Trace file; default: the bundled demo (the Azure cut's first "
                                                       "16 requests at 6 times their rate, clipped to the model's "
                                                       "context).")] = None,
    trace_latest: Annotated[Optional[Path], typer.Option(help="Folder of traces: take its most recently modified "
                                                              "file, and warm-start from the latest study on the "
                                                              "same model and space with a feasible "
                                                              "configuration.")] = None,
    warm_from: Annotated[Optional[str], typer.Option(help="Queue this earlier study's best configurations right "
                                                          "after the baseline.")] = None,
    space: Annotated[str, typer.Option(help="Search space: a shipped name, a YAML file, or auto (derived from the "
                                            "model, this machine and the trace: see `tuner space suggest`).")
                     ] = "cpu-small",
    boundary: Annotated[str, typer.Option(help=f"{BOUNDARY_HELP}.")] = "interactive",
    limits: LimitOption = [],
    window: Annotated[Optional[str], typer.Option(help="START:END seconds of the trace.")] = None,
    rate_scale: Annotated[Optional[float], typer.Option(help="Multiply the arrival rate.")] = None,
    max_requests: Annotated[Optional[int], typer.Option(help="Keep the first N requests.")] = None,
    fit: Annotated[Optional[str], typer.Option(help="clip or scale lengths to each trial's max_model_len.")] = None,
    spread: SpreadOption = False,
    sampler: Annotated[str, typer.Option(help="bottleneck (relieves what vLLM's figures show holds the best "
                                               "trials back, TPE otherwise), tpe, random or nsga2.")] = "bottleneck",
    seed: Annotated[Optional[int], typer.Option(help="Sampler seed.")] = None,
    request_timeout_s: RequestTimeoutOption = 600.0, startup_timeout_s: StartupTimeoutOption = 600.0,
    load: LoadOption = "search",
    precision: Annotated[Optional[float], typer.Option(help="The load search ends once its bracket is within this "
                                                            "share: default 0.1 (10%), 0.25 for the bundled demo "
                                                            "trace.")] = None,
    probe_budget: ProbeBudgetOption = 6, load_range: LoadRangeOption = None, probe_requests: ProbeRequestsOption = 80,
    probe_seconds: Annotated[Optional[float], typer.Option(help="Each probe's arrivals last at least this many "
                                                                "seconds: default 20, 10 for the bundled demo "
                                                                "trace.")] = None,
    allow_fp8: Annotated[bool, typer.Option("--allow-fp8", help="Search FP8 weights and FP8 KV cache too (GPUs of "
                                                                "compute capability 8.9 or later): more capacity, "
                                                                "but outputs differ from the model's own precision; "
                                                                "check your own quality evaluations.")] = False,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
    server: ServerOption = None, token_file: TokenFileOption = None,
) -> None:
    """Create a study; its first trial will be vLLM's default configuration (the baseline), then any
    configurations carried over from an earlier study (--warm-from, or --trace-latest)."""
    # lazy: keeps the CLI's start fast (pydantic)
    from pydantic import ValidationError

    from tuner.studies import StudyRequest

    if trace is not None and trace_latest is not None:
        raise typer.BadParameter("give --trace or --trace-latest, not both")
    # Each field of the request is the parameter of its name; the others (where to ask, --json) it ignores. Paths
    # go as given: they are read where the study is created.
    given = {param: str(value) if isinstance(value, Path) else value for param, value in ctx.params.items()}
    try:
        request = StudyRequest.model_validate(given)
    except ValidationError as exc:  # the request's own limits (a name of 1 to 200 characters): bad usage
        first = exc.errors()[0]
        raise TunerError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    created = study_answers(server, token_file, storage, artifacts).create(request)
    if as_json:
        return print_json(created.to_dict())
    out.print(f"study {name} created in {created.storage}: space {created.space_name}, "
              f"boundary {created.boundary}, trace {Path(created.trace_path).name}; "
              f"run it with `tuner study run {name} --trials N`")
    out.print(probe_length_line(created.probe_length, created.request_timeout_s), highlight=False)
    if "warm_start" in created.model_fields_set:
        warm = created.warm_start
        if warm is None:
            out.print("no earlier study on the same model and space to warm-start from")
        else:
            out.print(f"warm start from study {warm.from_}: "
                      + (f"its trials {', '.join(map(str, warm.trials))} queued after the baseline" if warm.trials
                         else "it has no feasible configuration besides vLLM's defaults to carry over"))
            for why in warm.skipped:
                out.print(f"  not carried over: {why}", highlight=False)


study_app.command("run")(study_run)
study_app.command("validate")(study_validate)


@study_app.command("enqueue")
def study_enqueue(name: StudyArgument, set_: SetOption,
                  storage: StorageOption = None, artifacts: ArtifactsOption = None, server: ServerOption = None,
                  token_file: TokenFileOption = None) -> None:
    """Queue a configuration to run next, ahead of the sampler."""
    done = study_answers(server, token_file, storage, artifacts).enqueue(name, set_)
    out.print(f"enqueued in study {name}: {done.engine_config}")


@study_app.command("list")
def study_list(storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
               server: ServerOption = None, token_file: TokenFileOption = None) -> None:
    """Every study in the storage."""
    rows = study_answers(server, token_file, storage, artifacts).list()
    if as_json:
        return print_json([r.to_dict() for r in rows])
    table = Table("name", "created", "boundary", "space", "trace", "trials", "feasible")
    for r in rows:
        table.add_row(r.name, r.created_at, r.boundary, r.space, r.trace, str(r.trials), str(r.feasible))
    out.print(table)


@study_app.command("status")
def study_status(name: StudyArgument, storage: StorageOption = None,
                 artifacts: ArtifactsOption = None, as_json: JsonOption = False, server: ServerOption = None,
                 token_file: TokenFileOption = None) -> None:
    """Trials by state, the trial in flight, and the best so far."""
    data = study_answers(server, token_file, storage, artifacts).status(name)
    if as_json:
        return print_json(data.to_dict())
    best = data.best
    table = Table(title=f"study {name} ({data.boundary})", show_header=False)
    validation = f" ({data.validation_launches} of them validation launches)" if data.validation_launches else ""
    table.add_row("trials ended", f"{data.trials}{validation}")
    for state, count in sorted(data.by_state.items()):
        table.add_row(f"  {state}", str(count))
    table.add_row("in flight", ", ".join(f"trial {n}" for n in data.running) or "-")
    table.add_row("waiting (enqueued)", ", ".join(f"trial {n}" for n in data.waiting) or "-")
    table.add_row("best so far", best_so_far_line(best) if best else "none feasible yet")
    if data.baseline is not None:
        table.add_row("vLLM's default", default_line(data.baseline))
    table.add_row("validation", data.validation)
    if data.spent is not None:
        table.add_row("spent", data.spent.text)
    out.print(table)


@study_app.command("best")
def study_best(name: StudyArgument, storage: StorageOption = None,
               artifacts: ArtifactsOption = None, as_json: JsonOption = False, server: ServerOption = None,
               token_file: TokenFileOption = None) -> None:
    """The recommended `vllm serve` command, its boundary, the hardware it was measured on, and the gain over
    vLLM's default configuration."""
    # lazy: keeps the CLI's start fast (the answers' pydantic models)
    from tuner.studies import NoRecommendation

    try:
        rec = study_answers(server, token_file, storage, artifacts).best(name)
    except NoRecommendation as exc:
        if as_json:
            print_json(None)
        else:
            err.print(str(exc), highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        return print_json(rec.to_dict())
    print_recommendation(rec)


@study_app.command("export")
def study_export(name: StudyArgument,
                 out_file: Annotated[Optional[Path],
                                     typer.Option("--out", help="File to write; default: stdout.")] = None,
                 format: Annotated[str, typer.Option("--format", help="json or csv.")] = "json",
                 requests: Annotated[bool, typer.Option(help="Include every request row (json only).")] = False,
                 storage: StorageOption = None, artifacts: ArtifactsOption = None, server: ServerOption = None,
                 token_file: TokenFileOption = None) -> None:
    """Every trial with its configuration, measurement, failure and score."""
    # lazy: keeps the CLI's start fast (the answers' pydantic models)
    from tuner.studies import EXPORT_FORMATS

    if format not in EXPORT_FORMATS:
        raise typer.BadParameter(f"--format must be json or csv, got {format!r}")
    text = study_answers(server, token_file, storage, artifacts).export(name, format, requests)
    if out_file is None:
        sys.stdout.write(text)
    else:
        out_file.write_text(text)


@study_app.command("plan")
def study_plan(
    name: StudyArgument,
    peak: Annotated[Optional[float], typer.Option(help="Peak traffic, req/s; default: the trace's busiest window at "
                                                       "--scale.")] = None,
    peak_window: Annotated[str, typer.Option(help="The window the trace's peak is taken over.")] = "60s",
    scale: Annotated[Optional[float], typer.Option(help="Your traffic is the trace's recorded rate times this; "
                                                        "default: the study's rate scale.")] = None,
    rates: Annotated[Optional[Path], typer.Option(help="A day's traffic: CSV `hour,rps`, 24 rows (hours 0-23); "
                                                       "default: the trace's own arrivals per hour.")] = None,
    day: Annotated[bool, typer.Option("--day", help="Fail when no daily curve can be had (a trace under 24 hours "
                                                    "without --rates).")] = False,
    gpu_hour_cost: Annotated[Optional[float], typer.Option(help="US dollars per GPU-hour (CPU slot-hour on the CPU "
                                                                "build), for the cost per day and per million "
                                                                "output tokens.")] = None,
    headroom: Annotated[float, typer.Option(help="The share of each replica's capacity the plan uses.")] = 0.8,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
    server: ServerOption = None, token_file: TokenFileOption = None,
) -> None:
    """How many replicas of vLLM's default, the recommendation and the best at the model's own precision carry your
    traffic within the boundary: at its peak, hour by hour over a day, and at what cost."""
    # lazy: keeps the CLI's start fast (tuner.study.capacity_plan: ~10 ms)
    from tuner.study.capacity_plan import PlanOptions

    hourly = None
    if rates is not None:
        try:
            text = rates.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise TunerError(f"--rates {rates}: cannot read the file ({exc})") from None
        hourly = read_hourly_rates(str(rates), text)
    try:
        window_s = parse_duration(peak_window)
    except TunerError as exc:
        raise TunerError(f"--peak-window: {exc}") from None
    options = PlanOptions(peak, window_s, scale, hourly, gpu_hour_cost, headroom, day)
    plan = study_answers(server, token_file, storage, artifacts).capacity_plan(name, options)
    if as_json:
        return print_json(plan.to_dict())
    print_plan(plan)
