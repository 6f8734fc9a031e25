"""Study runs started by the service: each is a `tuner study run` process of its own, joined to the service's
Ray cluster, so a run that crashes never takes the service down and a stopped run unwinds as Ctrl-C does
(every engine stopped). Its progress is read from the events it writes, one JSON line per event."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuner.errors import NotFound
from tuner.workers.process_group import die_with_parent

STOP_WAIT_S = 60.0  # a stopped run gets this long to stop its engines before it is killed


@dataclass
class RunRecord:
    """One run as the service reports it."""

    id: str
    study: str
    trials: int | None  # None: as many as fit in the window
    started_at: float
    state: str = "running"  # running, finished, failed, stopped
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    result: dict | None = None  # what `tuner study run --json` printed
    in_flight: list[dict] = field(default_factory=list)  # trials started and not yet done
    finished: list[dict] = field(default_factory=list)  # their summaries, in the order they ended

    def to_dict(self) -> dict:
        return {**asdict(self), "progress": {"done": len(self.finished), "of": self.trials}}


class _Run:
    def __init__(self, record: RunRecord, process: subprocess.Popen, folder: Path):
        self.record, self.process, self.folder = record, process, folder
        self.stop_requested = False

    @property
    def events_path(self) -> Path:
        return self.folder / "events.jsonl"

    def refresh(self) -> RunRecord:
        """The record with what the run's events say so far."""
        started: dict[int, dict] = {}
        finished: list[dict] = []
        if self.events_path.exists():
            for line in self.events_path.read_text().splitlines():
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
        return self.record


def run_env(plan) -> dict[str, str]:
    """The environment of a `tuner study run` started for a study in `plan`: the storage URL goes by
    environment, not argv, where any user could read its password."""
    return {**os.environ, "TUNER_STORAGE": plan.url, "TUNER_ARTIFACTS": str(plan.artifact_dir)}


def study_run_argv(study: str, *, trials: int | None = None, window_s: float | None = None,
                   timeout_s: float | None = None, parallel: int | None = None, prune: bool = True,
                   events: Path | None = None) -> list[str]:
    """`tuner study run` with --json, as a process of its own."""
    argv = [sys.executable, "-m", "tuner", "study", "run", study, "--json", "--prune" if prune else "--no-prune"]
    for option, value in (("--trials", trials), ("--window", window_s), ("--timeout", timeout_s),
                          ("--parallel", parallel), ("--events", events)):
        if value is not None:
            argv += [option, str(value)]
    return argv


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
        argv = study_run_argv(study, trials=trials, window_s=window_s, timeout_s=timeout_s, parallel=parallel,
                              prune=prune, events=folder / "events.jsonl")
        launched: Future[_Run] = Future()
        # The run's own thread starts it and waits for it: the run is told to stop (SIGTERM) when that thread
        # exits (die_with_parent), so with the service, not with this request's worker thread, which the server
        # may retire at any time.
        threading.Thread(target=self._launch_and_await, args=(RunRecord(run_id, study, trials, time.time()), argv,
                                                               folder, launched),
                         daemon=True, name=f"run-{run_id}").start()
        run = launched.result()
        with self._lock:
            self._runs[run_id] = run
        return run.refresh().to_dict()

    def _launch_and_await(self, record: RunRecord, argv: list[str], folder: Path, launched: Future) -> None:
        try:
            with open(folder / "stdout.json", "wb") as stdout, open(folder / "stderr.log", "wb") as stderr:
                # A process group of its own: when the replica dies, Ray SIGKILLs the replica's group 0.2 s after
                # its SIGTERM, too soon for the run to record its trials as stopped.
                process = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                           env=run_env(self.plan), preexec_fn=die_with_parent, process_group=0)
        except BaseException as exc:
            launched.set_exception(exc)
            return
        run = _Run(record, process, folder)
        launched.set_result(run)
        self._await(run)

    def _await(self, run: _Run) -> None:
        code = run.process.wait()
        record = run.refresh()
        record.exit_code, record.ended_at = code, time.time()
        text = (run.folder / "stdout.json").read_text(errors="replace").strip()
        try:
            record.result = json.loads(text) if text else None
        except json.JSONDecodeError:
            record.result = None
        if run.stop_requested:
            record.state = "stopped"
        elif code == 0:
            record.state = "finished"
        else:
            record.state = "failed"
            lines = [line for line in (run.folder / "stderr.log").read_text(errors="replace").splitlines()
                     if line.strip()]
            record.error = lines[-1] if lines else f"exit code {code}"

    def _get(self, run_id: str) -> _Run:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise NotFound(f"no run with id {run_id}")
        return run

    def get(self, run_id: str) -> dict:
        run = self._get(run_id)
        return (run.refresh() if run.record.state == "running" else run.record).to_dict()

    def list(self, study: str | None = None) -> list[dict]:
        with self._lock:
            runs = list(self._runs.values())
        return [self.get(r.record.id) for r in runs if study is None or r.record.study == study]

    def stop(self, run_id: str) -> dict:
        """Ask the run to stop as Ctrl-C would; it is killed if it has not stopped within STOP_WAIT_S."""
        run = self._get(run_id)
        if run.process.poll() is None:
            run.stop_requested = True
            run.process.send_signal(signal.SIGTERM)
            threading.Thread(target=self._kill_late, args=(run, STOP_WAIT_S), daemon=True).start()
        return self.get(run_id)

    @staticmethod
    def _kill_late(run: _Run, wait_s: float) -> None:
        try:
            run.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            run.process.kill()

    def stop_all(self) -> None:
        """Stop every run and wait for them, all within one STOP_WAIT_S (the service is going away)."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            if run.process.poll() is None:
                run.stop_requested = True
                run.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for run in runs:
            self._kill_late(run, max(0.0, deadline - time.monotonic()))
