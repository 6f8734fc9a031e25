"""Study runs started by the service: each is a `tuner study run` process of its own, joined to the service's
Ray cluster, so a run that crashes never takes the service down and a stopped run unwinds as Ctrl-C does
(every engine stopped). Its progress is read from the events it writes, one JSON line per event."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, replace

from tuner.common.errors import NotFound
from tuner.study.budget import BudgetPlan
from tuner.study.events import (BudgetPlanned, RunReport, TrialDone, TrialStarted, TrialSummary, logged_dict,
                                read_event_line)
from tuner.supervisor import RunRequest, RunState, StudyRunChild, run_env, study_run_argv

EVENTS_FILE = "events.jsonl"  # what the run writes as it goes: one JSON line per trial started or done


@dataclass(frozen=True)
class RunRecord:
    """One run as it stood when read: its state, the trials in flight and those finished, and once it has ended,
    how and what it reported."""

    id: str
    study: str
    trials: int | None  # None: as many as fit in the window
    started_at: float
    state: RunState = RunState.RUNNING  # then finished, failed or stopped
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    result: RunReport | None = None  # what `tuner study run --json` printed
    in_flight: tuple[TrialStarted, ...] = ()  # trials started and not yet done
    finished: tuple[TrialSummary, ...] = ()  # their summaries, in the order they ended
    plan: BudgetPlan | None = None  # the run's budget plan as it last said it; None without a budget

    def to_dict(self) -> dict:
        """The run as the service answers it: every field, each trial in flight as its line of the events file holds
        it, and `progress` as {done, of}."""
        return {"id": self.id, "study": self.study, "trials": self.trials, "started_at": self.started_at,
                "state": self.state.value, "ended_at": self.ended_at, "exit_code": self.exit_code,
                "error": self.error, "result": self.result.to_dict() if self.result else None,
                "in_flight": [logged_dict(started) for started in self.in_flight],
                "finished": [summary.to_dict() for summary in self.finished],
                "progress": {"done": len(self.finished), "of": self.trials},
                "plan": self.plan.to_dict() if self.plan else None}

    @classmethod
    def from_dict(cls, data: dict) -> RunRecord:
        """The record `to_dict` gave (as `tuner study run --server` reads the service's answer back)."""
        return cls(data["id"], data["study"], data["trials"], data["started_at"], RunState(data["state"]),
                   data["ended_at"], data["exit_code"], data["error"],
                   RunReport.from_dict(data["result"]) if data["result"] is not None else None,
                   tuple(TrialStarted.from_dict(started) for started in data["in_flight"]),
                   tuple(TrialSummary.from_dict(summary) for summary in data["finished"]),
                   BudgetPlan.from_dict(data["plan"]) if data.get("plan") else None)


class _Run:
    def __init__(self, record: RunRecord, child: StudyRunChild):
        self.record, self.child = record, child
        self._lock = threading.Lock()  # one refresh at a time: an older reading never replaces a newer one

    def refresh(self) -> RunRecord:
        """The record with what the run's events say so far, and how it ended once it has."""
        with self._lock:
            if self.record.state is RunState.RUNNING:
                self.record = self._read()
            return self.record

    def _read(self) -> RunRecord:
        end = self.child.end  # taken before the events are read: when it has ended, they are all there
        started: dict[int, TrialStarted] = {}
        finished: list[TrialSummary] = []
        plan = None
        events = self.child.folder / EVENTS_FILE
        if events.exists():
            for line in events.read_text().splitlines():
                match read_event_line(line):
                    case TrialStarted() as event:
                        started[event.number] = event
                    case TrialDone(summary=summary):
                        started.pop(summary.number, None)
                        finished.append(summary)
                    case BudgetPlanned(plan=said):
                        plan = said
        record = replace(self.record, in_flight=tuple(started.values()), finished=tuple(finished), plan=plan)
        if end is None:
            return record
        error = end.failure_reason() if end.state is RunState.FAILED else None
        return replace(record, state=end.state, ended_at=end.ended_at, exit_code=end.exit_code, error=error,
                       result=end.result)


class RunBook:
    """The runs this service started, by id. Each joins the Ray cluster RAY_ADDRESS names."""

    def __init__(self, plan):
        self.plan = plan
        self.runs_dir = plan.artifact_dir / "runs"
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def start(self, study: str, request: RunRequest) -> RunRecord:
        """Start `tuner study run` for `study` as a child process with the request's options, its events in a folder of
        its own; the new run's record. The run goes on in the background."""
        run_id = uuid.uuid4().hex[:12]
        folder = self.runs_dir / run_id
        folder.mkdir(parents=True)
        record = RunRecord(run_id, study, request.trials, time.time())
        argv = study_run_argv(study, request, events=folder / EVENTS_FILE)
        run = _Run(record, StudyRunChild.start(argv, run_env(self.plan), folder))
        with self._lock:
            self._runs[run_id] = run
        return run.refresh()

    def _get(self, run_id: str) -> _Run:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise NotFound(f"no run with id {run_id}")
        return run

    def get(self, run_id: str) -> RunRecord:
        """The run's record as it stands now; NotFound for an id this book did not start."""
        return self._get(run_id).refresh()

    def list(self, study: str | None = None) -> list[RunRecord]:
        """The records of the runs this book started, in the order started: all of them, or those of `study`."""
        with self._lock:
            runs = list(self._runs.values())
        return [run.refresh() for run in runs if study is None or run.record.study == study]

    def stop(self, run_id: str) -> RunRecord:
        """Ask the run to stop as Ctrl-C would (it is killed if it has not stopped within STOP_GRACE_S); its record,
        NotFound for an id this book did not start."""
        run = self._get(run_id)
        run.child.stop("asked to")
        return run.refresh()

    def stop_all(self) -> None:
        """Stop every run and wait for them, all within about STOP_GRACE_S (the service is going away)."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.child.stop("the service is going away")
        for run in runs:
            run.child.wait()
