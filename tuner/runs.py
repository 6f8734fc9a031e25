"""Study runs started by the service: each is a `tuner study run` process of its own, joined to the service's
Ray cluster, so a run that crashes never takes the service down and a stopped run unwinds as Ctrl-C does
(every engine stopped). Its progress is read from the events it writes, one JSON line per event."""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

from tuner.errors import NotFound
from tuner.supervisor import RunState, StudyRunChild, run_env, study_run_argv

EVENTS_FILE = "events.jsonl"  # what the run writes as it goes: one JSON line per trial started or done


@dataclass
class RunRecord:
    """One run as the service reports it."""

    id: str
    study: str
    trials: int | None  # None: as many as fit in the window
    started_at: float
    state: RunState = RunState.RUNNING  # then finished, failed or stopped
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    result: dict | None = None  # what `tuner study run --json` printed
    in_flight: list[dict] = field(default_factory=list)  # trials started and not yet done
    finished: list[dict] = field(default_factory=list)  # their summaries, in the order they ended

    def to_dict(self) -> dict:
        return {**asdict(self), "progress": {"done": len(self.finished), "of": self.trials}}


class _Run:
    def __init__(self, record: RunRecord, child: StudyRunChild):
        self.record, self.child = record, child

    def refresh(self) -> RunRecord:
        """The record with what the run's events say so far, and how it ended once it has."""
        if self.record.state is not RunState.RUNNING:
            return self.record
        end = self.child.end  # taken before the events are read: when it has ended, they are all there
        started: dict[int, dict] = {}
        finished: list[dict] = []
        events = self.child.folder / EVENTS_FILE
        if events.exists():
            for line in events.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:  # the line being written right now
                    continue
                if event["kind"] == "trial_started":
                    started[event["number"]] = event
                elif event["kind"] == "trial_done":
                    started.pop(event["summary"]["number"], None)
                    finished.append(event["summary"])
        self.record.in_flight, self.record.finished = list(started.values()), finished
        if end is not None:
            self.record.exit_code, self.record.ended_at, self.record.result = end.exit_code, end.ended_at, end.result
            if end.state is RunState.FAILED:
                lines = [line for line in end.stderr.splitlines() if line.strip()]
                self.record.error = lines[-1] if lines else f"exit code {end.exit_code}"
            self.record.state = end.state  # last: a record no longer running is not refreshed again
        return self.record


class RunBook:
    """The runs this service started, by id. Each joins the Ray cluster RAY_ADDRESS names."""

    def __init__(self, plan):
        self.plan = plan
        self.runs_dir = plan.artifact_dir / "runs"
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def start(self, study: str, trials: int | None, *, parallel: int | None = None, timeout_s: float | None = None,
              window_s: float | None = None, prune: bool = True) -> dict:
        run_id = uuid.uuid4().hex[:12]
        folder = self.runs_dir / run_id
        folder.mkdir(parents=True)
        record = RunRecord(run_id, study, trials, time.time())
        argv = study_run_argv(study, trials=trials, window_s=window_s, timeout_s=timeout_s, parallel=parallel,
                              prune=prune, events=folder / EVENTS_FILE)
        run = _Run(record, StudyRunChild.start(argv, run_env(self.plan), folder))
        with self._lock:
            self._runs[run_id] = run
        return run.refresh().to_dict()

    def _get(self, run_id: str) -> _Run:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise NotFound(f"no run with id {run_id}")
        return run

    def get(self, run_id: str) -> dict:
        return self._get(run_id).refresh().to_dict()

    def list(self, study: str | None = None) -> list[dict]:
        with self._lock:
            runs = list(self._runs.values())
        return [run.refresh().to_dict() for run in runs if study is None or run.record.study == study]

    def stop(self, run_id: str) -> dict:
        """Ask the run to stop as Ctrl-C would; it is killed if it has not stopped within STOP_GRACE_S."""
        run = self._get(run_id)
        run.child.stop("asked to")
        return run.refresh().to_dict()

    def stop_all(self) -> None:
        """Stop every run and wait for them, all within about STOP_GRACE_S (the service is going away)."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.child.stop("the service is going away")
        for run in runs:
            run.child.wait()
