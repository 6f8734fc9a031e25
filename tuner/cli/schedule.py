"""`tuner schedule ...`: studies resumed at set times for a set window, each run with a morning summary."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.table import Table

from tuner.cli.options import ArtifactsOption, JsonOption, StorageOption, storage_plan
from tuner.common.console import err, out, print_json
from tuner.common.durations import parse_duration
from tuner.storage.urls import redact_url

schedule_app = typer.Typer(help="Schedules: a study resumed at set times for a set window (say every night at "
                                "01:00 for 5 hours), each run ending with a morning summary.",
                           no_args_is_help=True)
NameArgument = Annotated[str, typer.Argument(help="The schedule.")]


def _book(storage: str | None, artifacts, **kwargs):
    # lazy: keeps the CLI's start fast (APScheduler)
    from tuner.schedules import ScheduleBook

    return ScheduleBook(storage_plan(storage, artifacts), **kwargs)


def _window_text(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"


@schedule_app.command("add")
def schedule_add(
    name: Annotated[str, typer.Argument(help="A name for the schedule.")],
    cron: Annotated[str, typer.Option(help="When runs start: minute hour day month weekday, in local time "
                                           "(\"0 1 * * *\": every night at 01:00; weekdays by name: mon-fri).")],
    window: Annotated[str, typer.Option(help="How long a run may last, e.g. 5h, 30m, 90s: no trial starts that "
                                             "cannot finish inside it, and one still running at its end is "
                                             "stopped.")],
    study: Annotated[Optional[str], typer.Option(help="The study to resume; default: the schedule's name.")] = None,
    trials: Annotated[Optional[int], typer.Option(min=1, help="At most this many trials a run; default: as many "
                                                              "as the window allows.")] = None,
    storage: StorageOption = None, artifacts: ArtifactsOption = None, as_json: JsonOption = False,
) -> None:
    """Add a schedule; the process hosting the schedules (`tuner serve` or `tuner schedule host`) runs it."""
    window_s = parse_duration(window)
    with _book(storage, artifacts) as book:
        schedule = book.add(name, study=study or name, cron=cron, window_s=window_s, trials=trials)
    if as_json:
        return print_json(schedule.to_dict())
    out.print(f"schedule {name}: study {schedule.study} at \"{cron}\" for {_window_text(window_s)}"
              f"{f', at most {trials} trials' if trials else ''}; next run {schedule.next_run:%Y-%m-%d %H:%M %Z}",
              highlight=False)


@schedule_app.command("list")
def schedule_list(storage: StorageOption = None, artifacts: ArtifactsOption = None,
                  as_json: JsonOption = False) -> None:
    """Every schedule, its next run and how its last run went."""
    with _book(storage, artifacts) as book:
        schedules = book.list()
    if as_json:
        return print_json([s.to_dict() for s in schedules])
    table = Table("name", "study", "cron", "window", "trials", "next run", "last run")
    for s in schedules:
        last = s.last_run
        table.add_row(s.name, s.study, s.cron, _window_text(s.window_s), str(s.trials or "-"),
                      f"{s.next_run:%Y-%m-%d %H:%M %Z}" if s.next_run else "never",
                      f"{last.started_at}: {last.state}, {len(last.trials)} trials" if last else "-")
    out.print(table)


@schedule_app.command("remove")
def schedule_remove(name: NameArgument, storage: StorageOption = None, artifacts: ArtifactsOption = None) -> None:
    """Remove a schedule (the summaries of its runs are kept)."""
    with _book(storage, artifacts) as book:
        book.remove(name)
    out.print(f"schedule {name} removed")


@schedule_app.command("run-now")
def schedule_run_now(name: NameArgument, storage: StorageOption = None, artifacts: ArtifactsOption = None) -> None:
    """Make a schedule due now: the process hosting the schedules starts its run within seconds (its regular
    times stay as they were). A run inside one of its windows ends with that window."""
    # lazy: keeps the CLI's start fast (APScheduler)
    from tuner.schedules import POLL_S

    with _book(storage, artifacts) as book:
        book.run_now(name)
    out.print(f"schedule {name} is due now: the process hosting the schedules (`tuner serve` or `tuner schedule "
              f"host`) starts it within {POLL_S:g} s")


@schedule_app.command("summary")
def schedule_summary(name: NameArgument,
                     runs: Annotated[int, typer.Option(min=1, help="How many of the latest runs.")] = 1,
                     storage: StorageOption = None, artifacts: ArtifactsOption = None,
                     as_json: JsonOption = False) -> None:
    """The morning summary of the schedule's latest run: trials run, failures by class, the best so far and
    whether it is new."""
    with _book(storage, artifacts) as book:
        found = book.runs(name, runs)
        if not found:
            book.get(name)  # a clear error for a schedule that does not exist
    if as_json:
        return print_json([r.to_dict() for r in found])
    if not found:
        out.print(f"schedule {name} has not run yet")
    for run in found:
        for i, line in enumerate(run.lines()):
            out.print(("" if i == 0 else "  ") + line, highlight=False, soft_wrap=True)


@schedule_app.command("host")
def schedule_host(storage: StorageOption = None, artifacts: ArtifactsOption = None) -> None:
    """Run the schedules of this database when due, in the foreground, until Ctrl-C (`tuner serve` does the
    same in the service). A run in progress at Ctrl-C is stopped, its trials in flight recorded as stopped."""
    # lazy: keeps the CLI's start fast (APScheduler)
    from tuner.schedules import RunFinished, RunStarted, ScheduleEvent

    def on_event(event: ScheduleEvent) -> None:
        match event:
            case RunStarted(schedule, study, window_end):
                err.print(f"schedule {schedule}: run of study {study} started, window until {window_end:%H:%M:%S}",
                          highlight=False)
            case RunFinished(run):
                for line in run.lines():
                    err.print(f"schedule {run.schedule}: {line}", highlight=False, soft_wrap=True)

    book = _book(storage, artifacts, on_event=on_event)
    try:
        book.start()
        err.print(f"hosting {len(book.list())} schedules of {redact_url(book.plan.url)}; Ctrl-C stops",
                  highlight=False)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        err.print("stopping: a run in progress is stopped and its summary written")
    finally:
        book.shutdown()
