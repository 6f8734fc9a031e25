"""Schedules: a study resumed at set times for a set window (say every night at 01:00 for five hours), each run
ending with a morning summary.

The schedules live in the study database, in APScheduler's SQLAlchemy job store (table `tuner_schedules`), so they
outlive the process that runs them; each run and its summary (`tuner.schedule_runs`) is a row of
`tuner_schedule_runs` beside it, one of tuner's migrated tables, which the Repository reads and writes. One process
hosts them (`tuner serve`, or `tuner schedule host`): it runs each schedule when due, one run at a time, as a
`tuner study run` subprocess, which keeps Ray and the engines out of the host. Any process may add, list, remove or
make a schedule due (the command line does, while the host runs): the host looks at the store every few seconds,
since APScheduler 3 only notices its own changes.

A run never goes past the end of the window it falls in: it starts no trial that cannot finish inside it
(judged by the study's median trial time) and stops any trial still running at its end. A run that starts
late (the host was down at the time, or another run held the machine) keeps only what is left of its window.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.job import Job
from apscheduler.jobstores.base import ConflictingIdError, JobLookupError
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED
from apscheduler.triggers.cron import CronTrigger

from tuner.common.errors import NotFound, TunerError
from tuner.schedule_runs import ScheduleBest, ScheduleRun, ScheduleTrial
from tuner.storage import StoredScheduleRun
from tuner.storage.schema import SCHEDULE_JOBS_TABLE
from tuner.study.plan import StoragePlan, load_optuna_study
from tuner.study.recommendation import recommend
from tuner.supervisor import RunRequest, RunState, StudyRunChild, run_env, study_run_argv

POLL_S = 5.0  # how often the host looks for schedules that other processes added or made due
# A run's `tuner study run` stops its own trials at the window's end; this long past it, it is told to stop.
OVERRUN_GRACE_S = 60.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,190}")  # APScheduler's job ids are at most 191 characters
_NUMBERED_WEEKDAY = re.compile(r"(?<![/\d])\d")  # a weekday number, not a step such as */2

_logger = logging.getLogger(__name__)


def cron_trigger(cron: str, timezone) -> CronTrigger:
    """APScheduler's trigger for a five-field crontab line, or a one-line TunerError."""
    fields = cron.split()
    # APScheduler 3 numbers weekdays from Monday = 0, cron from Sunday = 0: a number would fire on another day.
    if len(fields) == 5 and _NUMBERED_WEEKDAY.search(fields[4]):
        raise TunerError(f"cron {cron!r}: write the day of the week by name (sun, mon-fri, ...), not by number")
    try:
        return CronTrigger.from_crontab(cron, timezone=timezone)
    except ValueError as exc:
        raise TunerError(f"not a cron expression (minute hour day month weekday): {cron!r}: {exc}") from None


def due_time(trigger: CronTrigger, window_s: float, now: datetime) -> datetime:
    """When a run starting now was due: the schedule's latest fire time within the past window, else now (a
    run asked for outside any window gets a whole one)."""
    due = None
    fire = trigger.get_next_fire_time(None, now - timedelta(seconds=window_s))
    while fire is not None and fire <= now:
        due = fire
        fire = trigger.get_next_fire_time(fire, fire + timedelta(seconds=1))
    return due or now


@dataclass(frozen=True)
class Schedule:
    """A recurring run of a study: its cron, window and trial cap, when it next fires, and how its last run went."""

    name: str
    study: str
    cron: str  # as given: minute hour day month weekday, in the host's local time
    window_s: float
    trials: int | None  # at most this many trials a run; None: as many as the window allows
    next_run: datetime | None  # None: the cron can never fire again
    last_run: ScheduleRun | None

    def to_dict(self) -> dict:
        """The schedule as JSON-ready data, `next_run` in ISO 8601."""
        return {"name": self.name, "study": self.study, "cron": self.cron, "window_s": self.window_s,
                "trials": self.trials, "next_run": self.next_run.isoformat() if self.next_run else None,
                "last_run": self.last_run.to_dict() if self.last_run else None}


@dataclass(frozen=True)
class RunStarted:
    """A schedule's run has started; it ends by window_end."""

    schedule: str
    study: str
    window_end: datetime


@dataclass(frozen=True)
class RunFinished:
    """A schedule's run has ended, its row and morning summary written."""

    run: ScheduleRun


ScheduleEvent = RunStarted | RunFinished


class _Scheduler(BackgroundScheduler):
    def _process_jobs(self):
        # APScheduler 3 looks at the job store once more after shutdown, even when it was only paused, and would
        # move on (so lose) a run due right then: such a run must stay due for the host.
        return None if self.state == STATE_STOPPED else super()._process_jobs()


# The book hosting the schedules in this process: the job store keeps a function by reference and plain
# arguments, never the database URL (which may hold a password), so the job finds its book here.
_host: ScheduleBook | None = None


def run_schedule(name: str, study: str, cron: str, window_s: float, trials: int | None) -> None:
    """What the job store keeps for every schedule: one run, in the process that hosts the schedules."""
    if _host is None:
        raise RuntimeError(f"schedule {name} is due but no ScheduleBook hosts schedules in this process")
    _host._run(name, study, cron, window_s, trials)


class ScheduleBook:
    """The schedules of one study database. Opened as is, it reads and changes them; `start()` hosts them
    (runs each when due) until `shutdown()`. One process per database should host them."""

    def __init__(self, plan: StoragePlan, *, on_event: Callable[[ScheduleEvent], None] | None = None,
                 poll_s: float = POLL_S):
        self.plan = plan
        self.repo = plan.repository()  # tuner's tables migrated, or a clear error if the database is unreachable
        self.poll_s = poll_s
        self._emit = on_event or (lambda event: None)
        self._stopping = threading.Event()
        self._child: StudyRunChild | None = None  # the latest run's `tuner study run`
        # The Repository's engine: on SQLite it waits for other writers instead of failing.
        self._scheduler = _Scheduler(
            jobstores={"default": SQLAlchemyJobStore(engine=self.repo.engine, tablename=SCHEDULE_JOBS_TABLE)},
            # One run at a time: two would share (and fight over) the same GPUs or cores.
            executors={"default": ThreadPoolExecutor(1)},
            job_defaults={"coalesce": True, "max_instances": 1})

    # Hosting

    def start(self) -> None:
        """Run the schedules when due, from now until shutdown(). Runs found unfinished were cut short by a host
        that died: they are marked interrupted."""
        global _host
        if _host is not None and _host is not self:
            raise TunerError("this process hosts schedules already")
        _host = self
        self._mark_interrupted()
        if self._scheduler.state == STATE_STOPPED:
            self._scheduler.start()
        else:
            self._scheduler.resume()
        threading.Thread(target=self._poll, name="tuner-schedules-poll", daemon=True).start()

    def _poll(self) -> None:
        while not self._stopping.wait(self.poll_s):
            self._scheduler.wakeup()

    def shutdown(self) -> None:
        """Stop: a run in progress is stopped (its trials in flight recorded as stopped) and its summary written
        before this returns. Also closes a book that was only opened to read or change schedules."""
        global _host
        self._stopping.set()
        # Read after the flag is set, and set by a run before it reads the flag: one of the two stops a new child.
        if (child := self._child) is not None:
            child.stop("the host shut down")
        if self._scheduler.state != STATE_STOPPED:
            self._scheduler.shutdown(wait=True)
        if _host is self:
            _host = None

    def __enter__(self) -> ScheduleBook:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _open(self) -> BackgroundScheduler:
        """The scheduler, started paused if it is not hosting: its job store is then read and written directly."""
        if self._scheduler.state == STATE_STOPPED:
            self._scheduler.start(paused=True)
        return self._scheduler

    # Schedules

    def add(self, name: str, *, study: str, cron: str, window_s: float, trials: int | None = None) -> Schedule:
        """A new schedule: `cron` (minute hour day month weekday, local time) starts a run of `study` lasting at
        most `window_s` seconds and `trials` trials."""
        if not _NAME.fullmatch(name):
            raise TunerError(f"a schedule name is 1 to 191 letters, digits, '.', '_' or '-', starting with a "
                             f"letter or digit; got {name!r}")
        if window_s <= 0:
            raise TunerError(f"a window must be more than 0 s, got {window_s:g}")
        if trials is not None and trials < 1:
            raise TunerError(f"a run needs at least 1 trial, got {trials}")
        scheduler = self._open()
        trigger = cron_trigger(cron, scheduler.timezone)
        self.repo.get_study(study)
        try:
            # A run that could not start on time (the host was down) still starts while its window lasts.
            scheduler.add_job(run_schedule, trigger, id=name, name=name, misfire_grace_time=max(1, int(window_s)),
                              kwargs={"name": name, "study": study, "cron": cron, "window_s": window_s,
                                      "trials": trials})
        except ConflictingIdError:
            raise TunerError(f"schedule {name} already exists") from None
        return self.get(name)

    def get(self, name: str) -> Schedule:
        """The schedule named `name`; NotFound if there is none."""
        job = self._open().get_job(name)
        if job is None:
            raise NotFound(f"no schedule named {name}")
        return self._schedule(job)

    def list(self) -> list[Schedule]:
        """Every schedule, by name."""
        return sorted((self._schedule(job) for job in self._open().get_jobs()), key=lambda s: s.name)

    def remove(self, name: str) -> None:
        """Remove the schedule (its runs' summaries are kept)."""
        try:
            self._open().remove_job(name)
        except JobLookupError:
            raise NotFound(f"no schedule named {name}") from None

    def run_now(self, name: str) -> Schedule:
        """Make the schedule due now: the host starts its run at once (within poll_s when it is another process),
        and the regular times stay as they were."""
        scheduler = self._open()
        try:
            scheduler.modify_job(name, next_run_time=datetime.now(scheduler.timezone))
        except JobLookupError:
            raise NotFound(f"no schedule named {name}") from None
        return self.get(name)

    def runs(self, name: str, limit: int | None = None) -> list[ScheduleRun]:
        """The schedule's runs, the latest first (also those of a schedule since removed)."""
        return [ScheduleRun.of(stored) for stored in self.repo.schedule_runs(name, limit)]

    def _schedule(self, job: Job) -> Schedule:
        args = job.kwargs
        last = self.runs(job.id, 1)
        return Schedule(job.id, args["study"], args["cron"], args["window_s"], args["trials"], job.next_run_time,
                        last[0] if last else None)

    # Runs

    def _now(self) -> datetime:
        return datetime.now(self._scheduler.timezone)

    def _mark_interrupted(self) -> None:
        self.repo.end_schedule_runs(RunState.RUNNING, RunState.INTERRUPTED, self._now().isoformat(timespec="seconds"))

    def _standing(self, study: str) -> tuple[set[int], ScheduleBest | None]:
        """The study's recorded trial numbers and its recommendation, as they stand."""
        settings = self.repo.get_study(study)
        numbers = {t.trial_number for t in self.repo.trials(study)}
        rec = recommend(self.repo, settings, load_optuna_study(study, self.plan))
        return numbers, ScheduleBest.of(rec, settings) if rec else None

    def _run(self, name: str, study: str, cron: str, window_s: float, trials: int | None) -> None:
        started = self._now()
        due = due_time(cron_trigger(cron, self._scheduler.timezone), window_s, started)
        window_end = due + timedelta(seconds=window_s)
        before, previous_best = self._standing(study)
        stored = self.repo.save_schedule_run(StoredScheduleRun(
            name, study, RunState.RUNNING, due.isoformat(timespec="seconds"), started.isoformat(timespec="seconds"),
            window_end.isoformat(timespec="seconds"), None, ScheduleRun.summary([], None, previous_best)))
        self._emit(RunStarted(name, study, window_end))
        state = RunState.FAILED
        stopped_early: str | None = None
        error: str | None = None
        try:
            state, stopped_early, error = self._study_run(study, trials, window_end)
        except Exception as exc:
            error = f"{exc.__class__.__name__}: {exc}"
            raise
        finally:
            best = self._standing(study)[1]
            ran = [ScheduleTrial.of(t) for t in self.repo.trials(study) if t.trial_number not in before]
            summary = ScheduleRun.summary(ran, best, previous_best, stopped_early, error)
            stored = self.repo.save_schedule_run(replace(stored, state=state,
                                                         finished_at=self._now().isoformat(timespec="seconds"),
                                                         summary=summary))
            self._emit(RunFinished(ScheduleRun.of(stored)))

    def _study_run(self, study: str, trials: int | None,
                   window_end: datetime) -> tuple[RunState, str | None, str | None]:
        """`tuner study run` for what is left of the window; (run state, why it stopped early, error)."""
        left_s = (window_end - self._now()).total_seconds()
        if left_s <= 0:
            return RunState.FINISHED, "the window had ended before the run could start", None
        # Checked when the schedule was added: the request's limits guard the service's API, not a schedule.
        request = RunRequest.model_construct(trials=trials, window_s=round(left_s, 3))
        argv = study_run_argv(study, request)
        with tempfile.TemporaryDirectory(prefix="tuner-schedule-run-") as folder:
            self._child = child = StudyRunChild.start(argv, run_env(self.plan), Path(folder))
            if self._stopping.is_set():  # shutdown() began before it could see this child
                child.stop("the host shut down")
            end = child.wait(max(0.0, window_end.timestamp() + OVERRUN_GRACE_S - time.time()))
            if end is None:
                child.stop("it was still running well past its window's end")
                end = child.wait()
        stopped_early = end.result.stopped_early if end.result else None
        if end.state is RunState.STOPPED:
            return end.state, stopped_early, f"the run was stopped: {end.stopped_why}"
        if end.state is RunState.FAILED:
            _logger.warning("tuner study run %s exited %s: %s", study, end.exit_code, end.stderr[-2000:])
            return end.state, stopped_early, end.failure_reason()
        return end.state, stopped_early, None
