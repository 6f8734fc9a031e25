"""`tuner study ...` and `tuner dashboard`: the lifecycle of a study, from the command line."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from tuner.console import err, out, print_json, progress_bar
from tuner.errors import TunerError

if TYPE_CHECKING:  # annotations only: the commands load what they run when they run
    from tuner.study.events import RunEvent, RunReport, TrialStarted, TrialSummary

study_app = typer.Typer(help="Studies: a search over engine configurations, measured trial by trial.",
                        no_args_is_help=True)

StorageOption = Annotated[Optional[str], typer.Option(
    "--storage", envvar="TUNER_STORAGE", help="Database URL (SQLite file or PostgreSQL); default: a SQLite file "
                                             "in $TUNER_HOME.")]
ArtifactsOption = Annotated[Optional[Path], typer.Option(
    "--artifacts", envvar="TUNER_ARTIFACTS", help="Folder of trial artifacts; default: beside the SQLite file.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
ServerOption = Annotated[Optional[str], typer.Option(
    "--server", envvar="TUNER_SERVER", help="Ask the tuner service at this URL instead of running here "
                                            "(paths are then read on the service's machine).")]
TokenFileOption = Annotated[Optional[Path], typer.Option(
    "--token-file", help="File holding the service's bearer token; default: $TUNER_API_TOKEN_FILE, else "
                         "$TUNER_API_TOKEN.")]


def _plan(storage: str | None, artifacts: Path | None, **kwargs):
    from tuner.study.plan import StoragePlan

    return StoragePlan.resolve(storage, artifacts, **kwargs)


@study_app.command("create")
def study_create(
    name: Annotated[str, typer.Argument(help="A name for the study.")],
    model: Annotated[Optional[Path], typer.Option(help="Model folder; default: the tiny model.")] = None,
    trace: Annotated[Optional[Path], typer.Option(help="Trace file; default: the bundled Azure cut.")] = None,
    trace_latest: Annotated[Optional[Path], typer.Option(help="Folder of traces: take its most recently modified "
                                                              "file, and warm-start from the latest study on the "
                                                              "same model and space with a feasible "
                                                              "configuration.")] = None,
    warm_from: Annotated[Optional[str], typer.Option(help="Queue this earlier study's best configurations right "
                                                          "after the baseline.")] = None,
    space: Annotated[str, typer.Option(help="Search space: a shipped name, a YAML file, or auto (derived from the "
                                            "model, this machine and the trace: see `tuner space suggest`).")
                     ] = "cpu-small",
    boundary: Annotated[str, typer.Option(help="interactive or batch.")] = "interactive",
    limit: Annotated[list[str], typer.Option(help="Override a boundary limit, NAME=VALUE or NAME=none "
                                                  "(repeatable).")] = [],
    window: Annotated[Optional[str], typer.Option(help="START:END seconds of the trace.")] = None,
    rate_scale: Annotated[Optional[float], typer.Option(help="Multiply the arrival rate.")] = None,
    max_requests: Annotated[Optional[int], typer.Option(help="Keep the first N requests.")] = None,
    fit: Annotated[Optional[str], typer.Option(help="clip or scale lengths to each trial's max_model_len.")] = None,
    sampler: Annotated[str, typer.Option(help="bottleneck (relieves what vLLM's figures show holds the best "
                                               "trials back, TPE otherwise), tpe, random or nsga2.")] = "bottleneck",
    seed: Annotated[Optional[int], typer.Option(help="Sampler seed.")] = None,
    request_timeout: Annotated[float, typer.Option(help="Seconds one request may take.")] = 600.0,
    startup_timeout: Annotated[float, typer.Option(help="Seconds to wait for a healthy server.")] = 600.0,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
    server: ServerOption = None, token_file: TokenFileOption = None,
) -> None:
    """Create a study; its first trial will be vLLM's default configuration (the baseline), then any
    configurations carried over from an earlier study (--warm-from, or --trace-latest)."""
    from pydantic import ValidationError

    from tuner.studies import StudyRequest

    if trace is not None and trace_latest is not None:
        raise typer.BadParameter("give --trace or --trace-latest, not both")
    try:
        request = StudyRequest(name=name, model=str(model) if model else None, trace=str(trace) if trace else None,
                               trace_latest=str(trace_latest) if trace_latest else None, warm_from=warm_from,
                               space=space, boundary=boundary, limits=limit, window=window, rate_scale=rate_scale,
                               max_requests=max_requests, fit=fit, sampler=sampler, seed=seed,
                               request_timeout_s=request_timeout, startup_timeout_s=startup_timeout)
    except ValidationError as exc:  # the request's own limits (a name of 1 to 200 characters): bad usage
        first = exc.errors()[0]
        raise TunerError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    created = _studies(server, token_file, storage, artifacts).create(request)
    if as_json:
        return print_json(created.to_dict())
    out.print(f"study {name} created in {created.storage}: space {created.space_name}, "
              f"boundary {created.boundary}, trace {Path(created.trace_path).name}; "
              f"run it with `tuner study run {name} --trials N`")
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


def _deadline(timeout: float | None, until: str | None) -> float | None:
    if timeout is not None and until is not None:
        raise typer.BadParameter("give --timeout or --until, not both")
    if timeout is not None:
        return time.time() + timeout
    if until is None:
        return None
    try:
        at = datetime.strptime(until, "%H:%M").time()
    except ValueError:
        raise typer.BadParameter(f"--until expects HH:MM, got {until!r}") from None
    now = datetime.now()
    end = datetime.combine(now.date(), at)
    return (end if end > now else end + timedelta(days=1)).timestamp()


@study_app.command("run")
def study_run(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The study.")],
    trials: Annotated[Optional[int], typer.Option(min=1, help="Trials to run now; default: 8, or with --window "
                                                              "as many as fit.")] = None,
    parallel: Annotated[Optional[int], typer.Option(min=1, help="Trials in flight at once; default: every free "
                                                               "slot (GPUs / tensor_parallel_size, or 1 CPU slot).")] = None,
    ray_address: Annotated[Optional[str], typer.Option(envvar="RAY_ADDRESS", help="Join this Ray cluster instead "
                                                                                 "of starting a local one.")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Start no trial that would end after S seconds.")] = None,
    until: Annotated[Optional[str], typer.Option(help="Start no trial that would end after HH:MM.")] = None,
    window: Annotated[Optional[str], typer.Option(help="Run for at most this long (5h, 30m, 90s): start no trial "
                                                       "that would end after it, and stop any still running at "
                                                       "its end.")] = None,
    prune: Annotated[bool, typer.Option(help="Stop a trial once its boundary can no longer be met.")] = True,
    heartbeat: Annotated[int, typer.Option(min=1, help="Seconds between a running trial's heartbeats.")] = 30,
    grace: Annotated[int, typer.Option(min=1, help="Seconds of silence after which a trial counts as "
                                                   "interrupted and is re-run.")] = 90,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
    server: ServerOption = None, token_file: TokenFileOption = None,
    events: Annotated[Optional[Path], typer.Option(hidden=True, help="Append each trial's start and end to this "
                                                                      "file, one JSON line each (the service "
                                                                      "follows its runs so).")] = None,
) -> None:
    """Run trials of a study on Ray workers: each launches vLLM, replays the trace, and is scored under the
    boundary. SIGINT or SIGTERM stops the trials in flight and records them as stopped (a second one does not
    wait for that); the run then exits 130."""
    if server:
        # The service's runs join its own Ray cluster with its own heartbeat settings. RAY_ADDRESS from the
        # environment is left alone: only what was typed on this command line is refused.
        typed = [f"--{option.replace('_', '-')}" for option in ("ray_address", "heartbeat", "grace")
                 if ctx.get_parameter_source(option).name == "COMMANDLINE"]
        if typed:
            raise typer.BadParameter(f"{', '.join(typed)} cannot be used with --server: the service's runs use its "
                                     f"own Ray cluster and settings")
    stop_at = window_s = None
    if window is not None:
        from tuner.durations import parse_duration

        if timeout is not None or until is not None:
            raise typer.BadParameter("give --window, or --timeout or --until, not both")
        window_s = parse_duration(window)
        stop_at = time.time() + window_s
    deadline = _deadline(timeout, until)
    if trials is None and stop_at is None:
        trials = 8
    signalled: list[str] = []  # the signal that stopped the run, if one did
    with progress_bar(as_json) as progress:
        overall = progress.add_task(f"study {name}: starting Ray", total=trials)
        running: dict[int, int] = {}

        def started(event: TrialStarted) -> None:
            what = "baseline (vLLM defaults)" if event.baseline else event.config.to_dict()
            running[event.number] = progress.add_task(f"  trial {event.number} on slot {event.slot}: {what}",
                                                      total=None)

        def done(summary: TrialSummary) -> None:
            if summary.number in running:
                progress.remove_task(running.pop(summary.number))
            progress.advance(overall)
            if not as_json:
                err.print(_summary_line(summary), highlight=False)

        if server:
            # The service's clock may differ from ours: it is sent the time left.
            result = _run_on_service(name, trials, parallel, None if deadline is None else deadline - time.time(),
                                     window_s, prune, server, token_file, signalled, progress, overall, started,
                                     done)
        else:
            result = _run_here(name, trials, parallel, ray_address, deadline, stop_at, prune, heartbeat, grace,
                               storage, artifacts, events, signalled, progress, overall, started, done)
    if as_json:
        print_json(result.to_dict())
    else:
        if result.stopped_early:
            out.print(f"stopped after {len(result.trials)} trials: {result.stopped_early}")
        out.print(f"see `tuner study best {name}`")
    if signalled:
        raise typer.Exit(130)


def _stop_on_signals(runner, signalled: list[str]) -> dict:
    """From now on the first SIGINT or SIGTERM stops the run's trials and records them as stopped (its name is
    appended to `signalled`); a second one interrupts at once (every engine still dies with its worker).
    Returns the handlers it replaced."""

    def stop(signum, frame) -> None:
        if signalled:
            raise KeyboardInterrupt
        signalled.append(signal.Signals(signum).name)
        runner.stop(f"the run was stopped ({signalled[0]})")

    return {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}


def _run_here(name, trials, parallel, ray_address, deadline, stop_at, prune, heartbeat, grace, storage, artifacts,
              events, signalled, progress, overall, started, done) -> RunReport:
    from tuner.study.events import PoolReady, TrialDone, TrialStarted
    from tuner.study.runner import StudyRunner

    plan = _plan(storage, artifacts, heartbeat_interval_s=heartbeat, grace_period_s=grace)
    log = open(events, "a", buffering=1) if events else None

    def record(kind: str, data: dict) -> None:
        if log is not None:
            log.write(json.dumps({"kind": kind, **data}) + "\n")

    replaced: dict = {}

    def on_event(event: RunEvent) -> None:
        match event:
            case PoolReady(slots=slots):
                # Only now: until the pool is up no trial is in flight, and ray.init replaces the SIGTERM handler.
                replaced.update(_stop_on_signals(runner, signalled))
                progress.update(overall, description=f"study {name} ({slots} slots)")
            case TrialStarted():
                record("trial_started", event.to_dict())
                started(event)
            case TrialDone(summary=summary):
                record("trial_done", {"summary": summary.to_dict()})
                done(summary)

    runner = StudyRunner(name, plan, prune=prune, parallel=parallel, ray_address=ray_address, on_event=on_event)
    try:
        report = runner.run(trials, deadline, stop_at=stop_at)
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
        if log is not None:
            log.close()
    return report


def _run_on_service(name, trials, parallel, timeout_s, window_s, prune, server, token_file, signalled, progress,
                    overall, started, done) -> RunReport:
    """Start the run on the service and follow it. SIGINT or SIGTERM here stops it there, as a local run stops,
    and it is followed until it has (a second one stops following at once)."""
    from types import SimpleNamespace

    from tuner.service_client import remote_studies
    from tuner.study.events import TrialStarted, TrialSummary

    studies = remote_studies(server, token_file)
    run = studies.start_run(name, trials, parallel, timeout_s, window_s, prune)
    progress.update(overall, description=f"study {name} on {server} (run {run['id']})")
    # The handler only notes the stop and the loop sends it: an HTTP call from within the handler could cut into
    # the loop's own request.
    stop_wanted = threading.Event()
    replaced = _stop_on_signals(SimpleNamespace(stop=lambda reason: stop_wanted.set()), signalled)
    stop_sent = False
    shown_started: set[int] = set()
    shown_done = 0
    try:
        while True:
            for data in run["in_flight"]:
                if data["number"] not in shown_started:
                    shown_started.add(data["number"])
                    started(TrialStarted.from_dict(data))
            for summary in run["finished"][shown_done:]:
                done(TrialSummary.from_dict(summary))
            shown_done = len(run["finished"])
            if run["state"] != "running":
                break
            if stop_wanted.is_set() and not stop_sent:
                studies.stop_run(run["id"])
                stop_sent = True
                progress.update(overall, description=f"study {name} on {server}: stopping run {run['id']}")
            time.sleep(1.0)
            run = studies.run(run["id"])
    except KeyboardInterrupt:  # the second signal: stop following, but never leave the run going
        if not stop_sent:
            studies.stop_run(run["id"])
        raise
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
    if run["state"] == "failed" or run["result"] is None:
        raise TunerError(f"the run failed on the service: {run['error'] or run['state']}")
    from tuner.study.events import RunReport

    return RunReport.from_dict(run["result"])


def _summary_line(s: TrialSummary) -> str:
    """One line per finished trial, from its summary."""
    head = f"trial {s.number}{' (baseline)' if s.baseline else ''}: {s.state}"
    score = s.score
    if score is not None:
        head += (f", {score.completed_rps:.3f} req/s, p95 e2e {score.e2e_p95_s:.2f} s, "
                 f"{'feasible' if score.feasible else 'infeasible: ' + '; '.join(score.violations)}")
    elif s.failure_class:
        head += f" [{s.failure_class}] {s.reason}"
    elif s.reason:
        head += f": {s.reason}"
    return head


def _studies(server: str | None, token_file: Path | None, storage: str | None, artifacts: Path | None):
    """The study answers: asked of the service at `server`, or read from the storage here."""
    if server:
        from tuner.service_client import remote_studies

        return remote_studies(server, token_file)
    from tuner.studies import LocalStudies

    return LocalStudies(_plan(storage, artifacts))


@study_app.command("enqueue")
def study_enqueue(name: Annotated[str, typer.Argument(help="The study.")],
                  set_: Annotated[list[str], typer.Option("--set", help="Engine setting NAME=VALUE (repeatable).")],
                  storage: StorageOption = None, artifacts: ArtifactsOption = None, server: ServerOption = None,
                  token_file: TokenFileOption = None) -> None:
    """Queue a configuration to run next, ahead of the sampler."""
    done = _studies(server, token_file, storage, artifacts).enqueue(name, set_)
    out.print(f"enqueued in study {name}: {done.engine_config}")


@study_app.command("list")
def study_list(storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
               server: ServerOption = None, token_file: TokenFileOption = None) -> None:
    """Every study in the storage."""
    rows = _studies(server, token_file, storage, artifacts).list()
    if as_json:
        return print_json([r.to_dict() for r in rows])
    table = Table("name", "created", "boundary", "space", "trace", "trials", "feasible")
    for r in rows:
        table.add_row(r.name, r.created_at, r.boundary, r.space, r.trace, str(r.trials), str(r.feasible))
    out.print(table)


@study_app.command("status")
def study_status(name: Annotated[str, typer.Argument(help="The study.")], storage: StorageOption = None,
                 artifacts: ArtifactsOption = None, as_json: JsonOption = False, server: ServerOption = None,
                 token_file: TokenFileOption = None) -> None:
    """Trials by state, the trial in flight, and the best so far."""
    from rich.text import Text

    from tuner.describe import context_line

    data = _studies(server, token_file, storage, artifacts).status(name)
    if as_json:
        return print_json(data.to_dict())
    best = data.best
    table = Table(title=f"study {name} ({data.boundary})", show_header=False)
    table.add_row("trials", str(data.trials))
    for state, count in sorted(data.by_state.items()):
        table.add_row(f"  {state}", str(count))
    table.add_row("in flight", ", ".join(map(str, data.running)) or "-")
    table.add_row("waiting (enqueued)", ", ".join(map(str, data.waiting)) or "-")
    table.add_row("best so far", Text(f"trial {best.trial}: {best.completed_rps:.3f} req/s, p95 e2e "
                                      f"{best.e2e_p95_s:.2f} s; {context_line(best.to_dict())}") if best
                  else "none feasible yet")
    out.print(table)


@study_app.command("best")
def study_best(name: Annotated[str, typer.Argument(help="The study.")], storage: StorageOption = None,
               artifacts: ArtifactsOption = None, as_json: JsonOption = False, server: ServerOption = None,
               token_file: TokenFileOption = None) -> None:
    """The recommended `vllm serve` command, its boundary, the hardware it was measured on, and the gain over
    vLLM's default configuration."""
    from tuner.scoring import Score
    from tuner.studies import NoRecommendation

    try:
        rec = _studies(server, token_file, storage, artifacts).best(name)
    except NoRecommendation as exc:
        if as_json:
            print_json(None)
        else:
            err.print(str(exc), highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        return print_json(rec.to_dict())
    # The recommendation's records, as stored: the answer carries them in their stored shapes.
    m, score = rec.measurement, Score.from_dict(rec.score)
    out.print(f"Recommended for the {rec.boundary_text} boundary (trial {rec.trial}):")
    out.print(f"  {rec.serve_command}", highlight=False, soft_wrap=True)
    out.print(f"measured on {rec.measured_on}, vLLM {rec.vllm_version}, trace {Path(rec.trace['path']).name} "
              f"(sha256 {rec.trace['sha256'][:12]}, {m['requests']} requests)")
    out.print(f"completed {m['completed']}/{m['requests']} at {score.completed_rps:.3f} req/s, "
              f"{score.output_tps:.1f} output tok/s, p95 TTFT {m['ttft_s']['p95'] or 0:.3f} s, "
              f"p95 e2e {score.e2e_p95_s:.3f} s, {m['preemptions']} preemptions")
    base, gain = rec.baseline, rec.gain
    if base is None:
        out.print("vLLM's default configuration was not run in this study")
    elif gain is None:
        why = base["failure_class"] or ("infeasible" if base["state"] == "complete" else base["state"])
        out.print(f"vLLM's default configuration (trial {base['trial']}) gave no score to compare: {why}")
    else:
        out.print(f"against vLLM's default configuration (trial {base['trial']}): completed throughput "
                  f"x{gain['completed_rps_ratio']:.2f}, p95 e2e x{gain['e2e_p95_ratio']:.2f}"
                  f"{'' if base['score'].get('feasible') else ' (the default broke the boundary)'}")


@study_app.command("export")
def study_export(name: Annotated[str, typer.Argument(help="The study.")],
                 out_file: Annotated[Optional[Path], typer.Option("--out", help="File to write; default: stdout.")] = None,
                 format: Annotated[str, typer.Option("--format", help="json or csv.")] = "json",
                 requests: Annotated[bool, typer.Option(help="Include every request row (json only).")] = False,
                 storage: StorageOption = None, artifacts: ArtifactsOption = None, server: ServerOption = None,
                 token_file: TokenFileOption = None) -> None:
    """Every trial with its configuration, measurement, failure and score."""
    from tuner.studies import EXPORT_FORMATS

    if format not in EXPORT_FORMATS:
        raise typer.BadParameter(f"--format must be json or csv, got {format!r}")
    text = _studies(server, token_file, storage, artifacts).export(name, format, requests)
    if out_file is None:
        sys.stdout.write(text)
    else:
        out_file.write_text(text)


def dashboard(storage: StorageOption = None, artifacts: ArtifactsOption = None,
              host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
              port: Annotated[int, typer.Option(help="Port.")] = 8080) -> None:
    """Start optuna-dashboard on the same storage and artifact store."""
    from optuna.artifacts import FileSystemArtifactStore
    from optuna_dashboard import run_server

    from tuner.storage.urls import redact_url

    plan = _plan(storage, artifacts)
    plan.repository()  # a clear error now if the database cannot be reached
    plan.artifact_dir.mkdir(parents=True, exist_ok=True)
    err.print(f"optuna-dashboard for {redact_url(plan.url)} on http://{host}:{port}/ (Ctrl-C stops it)")
    try:
        run_server(plan.optuna_storage(), host=host, port=port,
                   artifact_store=FileSystemArtifactStore(str(plan.artifact_dir)))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
