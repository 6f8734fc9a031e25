"""`tuner study run`: trials of a study run here on Ray workers, or on a tuner service and followed from here,
with a progress bar, a line per finished trial, and SIGINT or SIGTERM stopping the run's trials."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer
from rich.progress import Progress, TaskID

from tuner.cli.options import (ArtifactsOption, JsonOption, PairingOption, RayAddressOption, RepeatsOption,
                               ServerOption, StorageOption, StudyArgument, TokenFileOption, TopOption, storage_plan)
from tuner.cli.present import summary_line
from tuner.common.console import err, out, print_json, progress_bar
from tuner.common.durations import parse_duration
from tuner.common.errors import TunerError
from tuner.validation import DEFAULT_REPEATS, DEFAULT_TOP

if TYPE_CHECKING:  # annotations only: the commands load what they run when they run
    from tuner.study.budget import BudgetPlan
    from tuner.study.events import RunEvent, RunReport, TrialStarted, TrialSummary
    from tuner.supervisor import RunRequest


@dataclass(frozen=True)
class RunSettings:
    """What one `tuner study run` was asked for: the run's options, as a service's run takes them too, its time
    limits resolved to clock times (epoch seconds), and where it runs."""

    name: str
    request: RunRequest  # trials None: as many as fit before stop_at; parallel None: every free slot
    deadline: float | None  # request.timeout_s as a clock time: start no trial that would end after this
    stop_at: float | None  # the --window's end: trials still running then are stopped
    # A run here:
    ray_address: str | None
    heartbeat_s: int
    grace_s: int
    storage: str | None
    artifacts: Path | None
    events: Path | None  # each trial's start and end appended here, one JSON line each
    # A run on a service:
    server: str | None
    token_file: Path | None


class RunProgress:
    """What a run shows while it goes: the overall bar, a bar per trial in flight, a line per finished trial
    (none with --json), and the signal that stopped the run, if one did."""

    def __init__(self, progress: Progress, name: str, trials: int | None, as_json: bool):
        self.progress, self.as_json = progress, as_json
        self.overall = progress.add_task(f"study {name}: starting Ray", total=trials)
        self.running: dict[int, TaskID] = {}
        self.signalled: list[str] = []
        self.plan: BudgetPlan | None = None

    def planned(self, plan: BudgetPlan) -> None:
        """The run's budget plan, said once each time it is made (none with --json)."""
        if not self.as_json and plan != self.plan:
            err.print(plan.text(), highlight=False)
        self.plan = plan

    def describe(self, text: str) -> None:
        """Say what the run as a whole is doing."""
        self.progress.update(self.overall, description=text)

    def started(self, event: TrialStarted) -> None:
        """A trial has started on a slot."""
        what = "baseline (vLLM defaults)" if event.baseline else event.config.to_dict()
        self.running[event.number] = self.progress.add_task(f"  trial {event.number} on slot {event.slot}: {what}",
                                                            total=None)

    def done(self, summary: TrialSummary) -> None:
        """A trial has ended."""
        if summary.number in self.running:
            self.progress.remove_task(self.running.pop(summary.number))
        self.progress.advance(self.overall)
        if not self.as_json:
            err.print(summary_line(summary), highlight=False)


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


def study_run(
    ctx: typer.Context,
    name: StudyArgument,
    trials: Annotated[Optional[int], typer.Option(min=1, help="Trials to run now; default: 8, or with --window "
                                                              "as many as fit.")] = None,
    parallel: Annotated[Optional[int], typer.Option(
        min=1, help="Trials in flight at once; default: every free slot (GPUs / tensor_parallel_size, or 1 CPU "
                    "slot).")] = None,
    ray_address: RayAddressOption = None,
    timeout: Annotated[Optional[float], typer.Option(help="Start no trial that would end after S seconds.")] = None,
    until: Annotated[Optional[str], typer.Option(help="Start no trial that would end after HH:MM.")] = None,
    window: Annotated[Optional[str], typer.Option(help="Run for at most this long (5h, 30m, 90s): start no trial "
                                                       "that would end after it, and stop any still running at "
                                                       "its end.")] = None,
    budget: Annotated[Optional[str], typer.Option(help="Spend at most this much GPU time (20m, 1h; summed over "
                                                       "slots), the validation included: the run plans its trials "
                                                       "and keeps the validation's time, and says what the budget "
                                                       "did not cover.")] = None,
    prune: Annotated[bool, typer.Option(help="Stop a trial once its boundary can no longer be met.")] = True,
    validate: Annotated[bool, typer.Option(help="Then launch the best configurations and vLLM's default again, "
                                                "interleaved, to state the gain with its interval (see `tuner "
                                                "study validate`).")] = True,
    top: TopOption = DEFAULT_TOP, repeats: RepeatsOption = DEFAULT_REPEATS, pairing: PairingOption = True,
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
    boundary; then validate the best against vLLM's default (unless --no-validate). SIGINT or SIGTERM stops the
    trials in flight and records them as stopped (a second one does not wait for that); the run then exits
    130."""
    # lazy: keeps the CLI's start fast (pydantic)
    from tuner.supervisor import RunRequest

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
        if timeout is not None or until is not None:
            raise typer.BadParameter("give --window, or --timeout or --until, not both")
        window_s = parse_duration(window)
        stop_at = time.time() + window_s
    budget_s = parse_duration(budget) if budget is not None else None
    deadline = _deadline(timeout, until)
    if trials is None and stop_at is None and budget_s is None:
        trials = 8
    # Unchecked against the request's limits, which guard the service's API: a run here takes what typer allows,
    # and a service checks what it is sent. The service's clock may differ from ours: it is sent the time left.
    request = RunRequest.model_construct(trials=trials, parallel=parallel,
                                         timeout_s=None if deadline is None else deadline - time.time(),
                                         window_s=window_s, budget_s=budget_s, prune=prune, validate=validate,
                                         top=top, repeats=repeats, pairing=pairing)
    settings = RunSettings(name=name, request=request, deadline=deadline, stop_at=stop_at, ray_address=ray_address,
                           heartbeat_s=heartbeat, grace_s=grace, storage=storage, artifacts=artifacts, events=events,
                           server=server, token_file=token_file)
    with progress_bar(as_json) as progress:
        shown = RunProgress(progress, name, request.trials, as_json)
        result = _run_on_service(settings, shown) if server else _run_here(settings, shown)
    _print_report(result, name, as_json)
    if shown.signalled:
        raise typer.Exit(130)


def _print_report(result: RunReport, name: str, as_json: bool) -> None:
    if as_json:
        print_json(result.to_dict())
        return
    if result.stopped_early:
        out.print(f"stopped after {len(result.trials)} trials: {result.stopped_early}")
    if result.validation:
        out.print(result.validation, highlight=False, soft_wrap=True)
    if result.spent:
        out.print(f"spent {result.spent.text()}", highlight=False, soft_wrap=True)
    out.print(f"see `tuner study best {name}`")


def study_validate(
    name: StudyArgument,
    top: TopOption = DEFAULT_TOP, repeats: RepeatsOption = DEFAULT_REPEATS, pairing: PairingOption = True,
    against_itself: Annotated[bool, typer.Option(help="An A/A check: launch vLLM's default against itself, whose "
                                                      "interval must include 1.")] = False,
    parallel: Annotated[Optional[int], typer.Option(min=1, help="Launches in flight at once; default: every free "
                                                                "slot.")] = None,
    ray_address: RayAddressOption = None,
    timeout: Annotated[Optional[float], typer.Option(help="Start no launch that would end after S seconds.")] = None,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
) -> None:
    """Launch vLLM's default configuration and the study's best configurations again, --repeats times each in
    interleaved order (A B C A B C ...), each a full measurement stored as a validation trial (on one GPU with
    vLLM's sleep mode: one engine each, taking turns, round by round); then state the best's gain over the default
    with its 95% interval, or that the default should be kept, and how the launches ran. Validation trials do not
    count as search trials. SIGINT or SIGTERM stops it as it stops `study run`."""
    # lazy: keeps the CLI's start fast (pydantic)
    from tuner.supervisor import RunRequest

    deadline = _deadline(timeout, None)
    request = RunRequest.model_construct(parallel=parallel, timeout_s=timeout, top=top, repeats=repeats,
                                         pairing=pairing)
    settings = RunSettings(name=name, request=request, deadline=deadline, stop_at=None, ray_address=ray_address,
                           heartbeat_s=30, grace_s=90, storage=storage, artifacts=artifacts, events=None, server=None,
                           token_file=None)
    with progress_bar(as_json) as progress:
        shown = RunProgress(progress, name, None, as_json)
        result = _run_here(settings, shown, validation_only=True, against_itself=against_itself)
    _print_report(result, name, as_json)
    if shown.signalled:
        raise typer.Exit(130)


def _stop_on_signals(stop_run: Callable[[str], None], signalled: list[str]) -> dict:
    """From now on the first SIGINT or SIGTERM calls `stop_run` with the reason, which stops the run's trials
    and records them as stopped (the signal's name is appended to `signalled`); a second one interrupts at once
    (every engine still dies with its worker). Returns the handlers it replaced."""

    def stop(signum, frame) -> None:
        if signalled:
            raise KeyboardInterrupt
        signalled.append(signal.Signals(signum).name)
        stop_run(f"the run was stopped ({signalled[0]})")

    return {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}


def _run_here(settings: RunSettings, shown: RunProgress, *, validation_only: bool = False,
              against_itself: bool = False) -> RunReport:
    """Run the trials on Ray workers from this process, then the validation if asked; only the validation for
    `study validate`."""
    # lazy: keeps the CLI's start fast (Ray; and the run's own modules, budget and events: ~10 ms)
    from tuner.study.budget import RunBudget
    from tuner.study.events import (BUDGET_KEPT, BUDGET_SPENT, BudgetPlanned, LoggedEvent, PoolReady, RunReport,
                                    TrialDone, TrialStarted, event_line)
    from tuner.study.runner import NothingToValidate, StudyRunner

    plan = storage_plan(settings.storage, settings.artifacts, heartbeat_interval_s=settings.heartbeat_s,
                        grace_period_s=settings.grace_s)
    log = open(settings.events, "a", buffering=1) if settings.events else None

    def record(event: LoggedEvent) -> None:
        if log is not None:
            log.write(event_line(event))

    replaced: dict = {}

    def on_event(event: RunEvent) -> None:
        match event:
            case PoolReady(slots=slots):
                # Only now: until the pool is up no trial is in flight, and ray.init replaces the SIGTERM handler.
                replaced.update(_stop_on_signals(runner.stop, shown.signalled))
                shown.describe(f"study {settings.name} ({slots} slots)")
            case BudgetPlanned(plan=plan):
                record(event)
                shown.planned(plan)
            case TrialStarted():
                record(event)
                shown.started(event)
            case TrialDone(summary=summary):
                record(event)
                shown.done(summary)

    request = settings.request
    runner = StudyRunner(settings.name, plan, prune=request.prune, parallel=request.parallel,
                         ray_address=settings.ray_address, on_event=on_event)
    # A window plans as a budget does: the search keeps the validation's time.
    budget = RunBudget(time.time(), request.budget_s, settings.stop_at,
                       (request.top + 1) * request.repeats if request.validate_ else 0,
                       request.top + 1 if request.validate_ else 0, settings.request.pairing) \
        if request.budget_s is not None or settings.stop_at is not None else None
    try:
        report = runner.run(request.trials, settings.deadline, stop_at=settings.stop_at, budget=budget) \
            if not validation_only else RunReport()
        # A search that stopped to keep the validation's time goes on to it.
        if request.validate_ and report.stopped_early in (None, BUDGET_KEPT, BUDGET_SPENT) and not shown.signalled:
            what = "vLLM's default against itself" if against_itself else "the best against vLLM's default"
            shown.describe(f"study {settings.name}: validating {what}, {request.repeats} launches each")
            try:
                validation, checked = runner.validate(request.top, request.repeats, against_itself=against_itself,
                                                      deadline=settings.deadline, stop_at=settings.stop_at,
                                                      budget=budget, paired=settings.request.pairing)
            except NothingToValidate as exc:
                if validation_only:  # asked for by `study validate` itself: an error, not a note
                    raise
                report.validation = f"not validated: {exc}"
            else:
                report.trials += checked.trials  # the search's own stop (none) stays the run's
                report.spent = checked.spent or report.spent
                report.validation = (validation.verdict() if validation.complete else
                                     f"not validated: the validation stopped ({checked.stopped_early}); "
                                     + (f"the launches it did not run stay queued, and the next `tuner study run "
                                        f"{settings.name}` runs them first" if validation.order or checked.trials
                                        else "no launch was started"))
    finally:
        runner.close()  # engines a search kept for a validation that did not take them
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
        if log is not None:
            log.close()
    return report


def _run_on_service(settings: RunSettings, shown: RunProgress) -> RunReport:
    """Start the run on the service and follow it. SIGINT or SIGTERM here stops it there, as a local run stops,
    and it is followed until it has (a second one stops following at once)."""
    # lazy: keeps the CLI's start fast (the answers' pydantic models; tuner.supervisor: ~10 ms)
    from tuner.service.client import remote_studies
    from tuner.supervisor import RunState

    name, server = settings.name, settings.server
    studies = remote_studies(server, settings.token_file)
    run = studies.start_run(name, settings.request)
    shown.describe(f"study {name} on {server} (run {run.id})")
    # The handler only notes the stop and the loop sends it: an HTTP call from within the handler could cut into
    # the loop's own request.
    stop_wanted = threading.Event()
    replaced = _stop_on_signals(lambda reason: stop_wanted.set(), shown.signalled)
    stop_sent = False
    shown_started: set[int] = set()
    shown_done = 0
    try:
        while True:
            if run.plan is not None:
                shown.planned(run.plan)
            for started in run.in_flight:
                if started.number not in shown_started:
                    shown_started.add(started.number)
                    shown.started(started)
            for summary in run.finished[shown_done:]:
                shown.done(summary)
            shown_done = len(run.finished)
            if run.state is not RunState.RUNNING:
                break
            if stop_wanted.is_set() and not stop_sent:
                studies.stop_run(run.id)
                stop_sent = True
                shown.describe(f"study {name} on {server}: stopping run {run.id}")
            time.sleep(1.0)
            run = studies.run(run.id)
    except KeyboardInterrupt:  # the second signal: stop following, but never leave the run going
        if not stop_sent:
            studies.stop_run(run.id)
        raise
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
    if run.state is RunState.FAILED or run.result is None:
        raise TunerError(f"the run failed on the service: {run.error or run.state}")
    return run.result
