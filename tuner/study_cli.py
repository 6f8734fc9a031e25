"""`tuner study ...` and `tuner dashboard`: the lifecycle of a study, from the command line."""

from __future__ import annotations

import csv
import json
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.console import err, out, print_json
from tuner.describe import boundary_line, hardware_line, recommendation_dict

study_app = typer.Typer(help="Studies: a search over engine configurations, measured trial by trial.",
                        no_args_is_help=True)

StorageOption = Annotated[Optional[str], typer.Option(
    "--storage", envvar="TUNER_STORAGE", help="Database URL (SQLite file or PostgreSQL); default: a SQLite file "
                                             "in $TUNER_HOME.")]
ArtifactsOption = Annotated[Optional[Path], typer.Option(
    "--artifacts", envvar="TUNER_ARTIFACTS", help="Folder of trial artifacts; default: beside the SQLite file.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _plan(storage: str | None, artifacts: Path | None, **kwargs):
    from tuner.study import StoragePlan

    return StoragePlan.resolve(storage, artifacts, **kwargs)


@study_app.command("create")
def study_create(
    name: Annotated[str, typer.Argument(help="A name for the study.")],
    model: Annotated[Optional[Path], typer.Option(help="Model folder; default: the tiny model.")] = None,
    trace: Annotated[Optional[Path], typer.Option(help="Trace file; default: the bundled Azure cut.")] = None,
    space: Annotated[str, typer.Option(help="Search space: a shipped name or a YAML file.")] = "cpu-small",
    boundary: Annotated[str, typer.Option(help="interactive or batch.")] = "interactive",
    limit: Annotated[list[str], typer.Option(help="Override a boundary limit, NAME=VALUE or NAME=none "
                                                  "(repeatable).")] = [],
    window: Annotated[Optional[str], typer.Option(help="START:END seconds of the trace.")] = None,
    rate_scale: Annotated[Optional[float], typer.Option(help="Multiply the arrival rate.")] = None,
    max_requests: Annotated[Optional[int], typer.Option(help="Keep the first N requests.")] = None,
    fit: Annotated[Optional[str], typer.Option(help="clip or scale lengths to each trial's max_model_len.")] = None,
    sampler: Annotated[str, typer.Option(help="tpe, random or nsga2.")] = "tpe",
    seed: Annotated[Optional[int], typer.Option(help="Sampler seed.")] = None,
    request_timeout: Annotated[float, typer.Option(help="Seconds one request may take.")] = 600.0,
    startup_timeout: Annotated[float, typer.Option(help="Seconds to wait for a healthy server.")] = 600.0,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
) -> None:
    """Create a study; its first trial will be vLLM's default configuration (the baseline)."""
    from tuner.cli import _default_model, _selection
    from tuner.paths import bundled_trace
    from tuner.scoring import parse_limits
    from tuner.study import create_study

    plan = _plan(storage, artifacts)
    settings = create_study(name, model=model or _default_model(), trace_path=trace or bundled_trace(),
                            selection=_selection(window, max_requests, rate_scale, fit), space=space,
                            boundary_name=boundary, limits=parse_limits(limit), plan=plan, sampler=sampler,
                            seed=seed, request_timeout_s=request_timeout, startup_timeout_s=startup_timeout)
    if as_json:
        return print_json(settings.__dict__)
    from storage.urls import redact_url

    out.print(f"study {name} created in {redact_url(plan.url)}: space {settings.space_name}, "
              f"boundary {settings.boundary}, trace {Path(settings.trace_path).name}; "
              f"run it with `tuner study run {name} --trials N`")


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
    name: Annotated[str, typer.Argument(help="The study.")],
    trials: Annotated[int, typer.Option(min=1, help="Trials to run now.")] = 8,
    parallel: Annotated[Optional[int], typer.Option(min=1, help="Trials in flight at once; default: every free "
                                                               "slot (GPUs / tensor_parallel_size, or 1 CPU slot).")] = None,
    ray_address: Annotated[Optional[str], typer.Option(envvar="RAY_ADDRESS", help="Join this Ray cluster instead "
                                                                                 "of starting a local one.")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Start no trial that would end after S seconds.")] = None,
    until: Annotated[Optional[str], typer.Option(help="Start no trial that would end after HH:MM.")] = None,
    prune: Annotated[bool, typer.Option(help="Stop a trial once its boundary can no longer be met.")] = True,
    heartbeat: Annotated[int, typer.Option(min=1, help="Seconds between a running trial's heartbeats.")] = 30,
    grace: Annotated[int, typer.Option(min=1, help="Seconds of silence after which a trial counts as "
                                                   "interrupted and is re-run.")] = 90,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
) -> None:
    """Run trials of a study on Ray workers: each launches vLLM, replays the trace, and is scored under the
    boundary."""
    from tuner.study import StudyRunner

    deadline = _deadline(timeout, until)
    plan = _plan(storage, artifacts, heartbeat_interval_s=heartbeat, grace_period_s=grace)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=as_json) as progress:
        overall = progress.add_task(f"study {name}: starting Ray", total=trials)
        running: dict[int, int] = {}

        def on_event(kind: str, data: dict) -> None:
            if kind == "pool_ready":
                progress.update(overall, description=f"study {name} ({data['slots']} slots)")
            elif kind == "trial_started":
                what = "baseline (vLLM defaults)" if data["baseline"] else data["config"]
                running[data["number"]] = progress.add_task(f"  trial {data['number']} on slot {data['slot']}: "
                                                            f"{what}", total=None)
            elif kind == "trial_done":
                summary = data["summary"]
                if summary.number in running:
                    progress.remove_task(running.pop(summary.number))
                progress.advance(overall)
                if not as_json:
                    err.print(_summary_line(summary), highlight=False)

        runner = StudyRunner(name, plan, prune=prune, parallel=parallel, ray_address=ray_address,
                             on_event=on_event)
        report = runner.run(trials, deadline)
    if as_json:
        return print_json({"trials": [_summary_dict(s) for s in report.trials],
                            "stopped_early": report.stopped_early})
    if report.stopped_early:
        out.print(f"stopped after {len(report.trials)} trials: {report.stopped_early}")
    out.print(f"see `tuner study best {name}`")


def _summary_dict(s) -> dict:
    return {"number": s.number, "state": s.state, "baseline": s.baseline, "config": s.config.to_dict(),
            "score": s.score.to_dict() if s.score else None, "failure_class": s.failure_class, "reason": s.reason}


def _summary_line(s) -> str:
    head = f"trial {s.number}{' (baseline)' if s.baseline else ''}: {s.state}"
    if s.score is not None:
        head += (f", {s.score.completed_rps:.3f} req/s, p95 e2e {s.score.e2e_p95_s:.2f} s, "
                 f"{'feasible' if s.score.feasible else 'infeasible: ' + '; '.join(s.score.violations)}")
    elif s.failure_class:
        head += f" [{s.failure_class}] {s.reason}"
    elif s.reason:
        head += f": {s.reason}"
    return head


def _open(name: str, storage: str | None, artifacts: Path | None):
    plan = _plan(storage, artifacts)
    from tuner.study import load_optuna_study

    repo = plan.repository()
    return plan, repo, repo.get_study(name), load_optuna_study(name, plan)


@study_app.command("enqueue")
def study_enqueue(name: Annotated[str, typer.Argument(help="The study.")],
                  set_: Annotated[list[str], typer.Option("--set", help="Engine setting NAME=VALUE (repeatable).")],
                  storage: StorageOption = None, artifacts: ArtifactsOption = None) -> None:
    """Queue a configuration to run next, ahead of the sampler."""
    from tuner.study import enqueue_config
    from workers.engine_config import EngineConfig

    config = EngineConfig.from_assignments(set_)
    enqueue_config(name, _plan(storage, artifacts), config)
    out.print(f"enqueued in study {name}: {config.to_dict()}")


@study_app.command("list")
def study_list(storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False) -> None:
    """Every study in the storage."""
    plan = _plan(storage, artifacts)
    repo = plan.repository()
    rows = []
    for s in repo.list_studies():
        trials = repo.trials(s.name)
        rows.append({"name": s.name, "created_at": s.created_at, "boundary": s.boundary, "space": s.space_name,
                     "trace": Path(s.trace_path).name, "trials": len(trials),
                     "feasible": sum(t.state == "complete" and bool(t.score.get("feasible")) for t in trials)})
    if as_json:
        return print_json(rows)
    table = Table("name", "created", "boundary", "space", "trace", "trials", "feasible")
    for r in rows:
        table.add_row(r["name"], r["created_at"], r["boundary"], r["space"], r["trace"], str(r["trials"]),
                      str(r["feasible"]))
    out.print(table)


@study_app.command("status")
def study_status(name: Annotated[str, typer.Argument(help="The study.")], storage: StorageOption = None,
                 artifacts: ArtifactsOption = None, as_json: JsonOption = False) -> None:
    """Trials by state, the trial in flight, and the best so far."""
    from optuna.trial import TrialState

    from tuner.study import recommend

    plan, repo, settings, study = _open(name, storage, artifacts)
    stored = repo.trials(name)
    states: dict[str, int] = {}
    for t in stored:
        states[t.state] = states.get(t.state, 0) + 1
    running = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    waiting = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    rec = recommend(repo, settings, study)
    data = {"name": name, "boundary": settings.boundary, "trials": len(stored), "by_state": states,
            "running": running, "waiting": waiting,
            "best": {"trial": rec.trial.trial_number, **rec.trial.score} if rec else None}
    if as_json:
        return print_json(data)
    table = Table(title=f"study {name} ({settings.boundary})", show_header=False)
    table.add_row("trials", str(len(stored)))
    for state, count in sorted(states.items()):
        table.add_row(f"  {state}", str(count))
    table.add_row("in flight", ", ".join(map(str, running)) or "-")
    table.add_row("waiting (enqueued)", ", ".join(map(str, waiting)) or "-")
    table.add_row("best so far", f"trial {rec.trial.trial_number}: {rec.trial.score['completed_rps']:.3f} req/s, "
                                 f"p95 e2e {rec.trial.score['e2e_p95_s']:.2f} s" if rec else "none feasible yet")
    out.print(table)


@study_app.command("best")
def study_best(name: Annotated[str, typer.Argument(help="The study.")], storage: StorageOption = None,
               artifacts: ArtifactsOption = None, as_json: JsonOption = False) -> None:
    """The recommended `vllm serve` command, its boundary, the hardware it was measured on, and the gain over
    vLLM's default configuration."""
    from tuner.study import recommend

    plan, repo, settings, study = _open(name, storage, artifacts)
    rec = recommend(repo, settings, study)
    if rec is None:
        if as_json:
            print_json(None)
        else:
            err.print(f"study {name}: no trial met the {settings.boundary} boundary yet")
        raise typer.Exit(1)
    data = recommendation_dict(rec, settings)
    if as_json:
        return print_json(data)
    t, m = rec.trial, rec.trial.measurement or {}
    out.print(f"Recommended for the {boundary_line(rec.boundary)} boundary (trial {t.trial_number}):")
    out.print(f"  {t.serve_command}", highlight=False, soft_wrap=True)
    out.print(f"measured on {hardware_line(t.hardware)}, vLLM {t.vllm_version}, trace "
              f"{Path(settings.trace_path).name} (sha256 {settings.trace_sha256[:12]}, {m.get('requests')} requests)")
    out.print(f"completed {m.get('completed')}/{m.get('requests')} at {t.score['completed_rps']:.3f} req/s, "
              f"{t.score['output_tps']:.1f} output tok/s, p95 TTFT {(m.get('ttft_s') or {}).get('p95') or 0:.3f} s, "
              f"p95 e2e {t.score['e2e_p95_s']:.3f} s, {m.get('preemptions')} preemptions")
    base = rec.baseline
    if base is None:
        out.print("vLLM's default configuration was not run in this study")
    elif rec.gain is None:
        why = base.failure_class or ("infeasible" if base.state == "complete" else base.state)
        out.print(f"vLLM's default configuration (trial {base.trial_number}) gave no score to compare: {why}")
    else:
        g = rec.gain
        out.print(f"against vLLM's default configuration (trial {base.trial_number}): completed throughput "
                  f"x{g['completed_rps_ratio']:.2f}, p95 e2e x{g['e2e_p95_ratio']:.2f}"
                  f"{'' if base.score.get('feasible') else ' (the default broke the boundary)'}")


@study_app.command("export")
def study_export(name: Annotated[str, typer.Argument(help="The study.")],
                 out_file: Annotated[Optional[Path], typer.Option("--out", help="File to write; default: stdout.")] = None,
                 format: Annotated[str, typer.Option("--format", help="json or csv.")] = "json",
                 requests: Annotated[bool, typer.Option(help="Include every request row (json only).")] = False,
                 storage: StorageOption = None, artifacts: ArtifactsOption = None) -> None:
    """Every trial with its configuration, measurement, failure and score."""
    if format not in ("json", "csv"):
        raise typer.BadParameter(f"--format must be json or csv, got {format!r}")
    plan, repo, settings, study = _open(name, storage, artifacts)
    trials = repo.trials(name)
    pareto = {t.number for t in study.best_trials}
    if format == "json":
        rows = []
        for t in trials:
            row = {**{k: v for k, v in t.__dict__.items() if k != "id"}, "pareto": t.trial_number in pareto}
            if requests:
                row["requests"] = [r.__dict__ for r in repo.requests(name, t.trial_number)]
            rows.append(row)
        from tuner.study import recommend

        rec = recommend(repo, settings, study)
        text = json.dumps({"study": settings.__dict__,
                           "recommendation": recommendation_dict(rec, settings) if rec else None,
                           "trials": rows}, indent=2, default=str) + "\n"
    else:
        import io

        buffer = io.StringIO()
        fields = ["trial_number", "attempt", "state", "pareto", "failure_class", "completed", "requests",
                  "completed_rps", "output_tps", "ttft_p95_s", "e2e_p95_s", "preemptions", "feasible",
                  "serve_command"]
        writer = csv.DictWriter(buffer, fieldnames=fields)
        writer.writeheader()
        for t in trials:
            m = t.measurement or {}
            writer.writerow({"trial_number": t.trial_number, "attempt": t.attempt, "state": t.state,
                             "pareto": t.trial_number in pareto, "failure_class": t.failure_class,
                             "completed": m.get("completed"), "requests": m.get("requests"),
                             "completed_rps": m.get("completed_rps"), "output_tps": m.get("output_tps"),
                             "ttft_p95_s": (m.get("ttft_s") or {}).get("p95"),
                             "e2e_p95_s": (m.get("e2e_s") or {}).get("p95"), "preemptions": m.get("preemptions"),
                             "feasible": t.score.get("feasible"), "serve_command": t.serve_command})
        text = buffer.getvalue()
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

    from storage.urls import redact_url

    plan = _plan(storage, artifacts)
    plan.repository()  # a clear error now if the database cannot be reached
    plan.artifact_dir.mkdir(parents=True, exist_ok=True)
    err.print(f"optuna-dashboard for {redact_url(plan.url)} on http://{host}:{port}/ (Ctrl-C stops it)")
    try:
        run_server(plan.optuna_storage(), host=host, port=port,
                   artifact_store=FileSystemArtifactStore(str(plan.artifact_dir)))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
