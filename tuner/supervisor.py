"""`tuner study run` as a child of the service or of the schedules' host: started in a process group of its own,
watched, stopped as Ctrl-C would (SIGTERM, then a kill after a grace), and what it printed collected.

Each child is started by a thread of its own that waits for it and so lives exactly as long as it does: the child
is tied to that thread (tied_to_this_thread), so it is told to stop if this process dies, however it dies, and never
because the thread that asked for it (a request's worker thread, which a server may retire) went away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from tuner.study.events import RunReport
from tuner.validation import DEFAULT_REPEATS, DEFAULT_TOP
from tuner.workers.tied import tied_to_this_thread

STOP_GRACE_S = 60.0  # a child told to stop gets this long to stop its engines and record its trials, then is killed
STDOUT_FILE, STDERR_FILE = "stdout.json", "stderr.log"


class RunState(StrEnum):
    """Where a run of a study stands. A str, so that stored rows and JSON hold the plain values."""

    RUNNING = "running"
    FINISHED = "finished"  # it exited with code 0
    FAILED = "failed"  # it exited otherwise, unasked
    STOPPED = "stopped"  # it was told to stop
    INTERRUPTED = "interrupted"  # whatever watched it died first (a schedules' host finds these when it restarts)


@dataclass(frozen=True)
class StudyRunEnd:
    """How a `tuner study run` child ended and what it printed."""

    state: RunState  # stopped if it was told to stop, else finished or failed by its exit code
    exit_code: int
    ended_at: float  # time.time() when it exited
    stopped_why: str | None  # why it was told to stop, if it was
    result: RunReport | None  # what `tuner study run --json` printed, if it printed a run's report
    stderr: str

    def failure_reason(self) -> str:
        """Why a failed child failed, in one line: its own `error:` line where it printed one, else how it ended
        (a signal, an exit code) and the last line it printed, which may be a library's log, not a cause."""
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        said = [line for line in lines if line.startswith("error:")]
        if said:
            return said[-1].removeprefix("error:").strip()
        how = (f"killed by {signal.Signals(-self.exit_code).name}" if self.exit_code < 0
               else f"exit code {self.exit_code}")
        last = f"; the last line it printed: {lines[-1]}" if lines else ", having printed nothing"
        return f"`tuner study run` ended ({how}) without naming an error{last}"


def run_env(plan) -> dict[str, str]:
    """The environment of a `tuner study run` started for a study in `plan`: the storage URL goes by
    environment, not argv, where any user could read its password."""
    return {**os.environ, "TUNER_STORAGE": plan.url, "TUNER_ARTIFACTS": str(plan.artifact_dir)}


class RunRequest(BaseModel):
    """The options of `tuner study run`."""

    # Declared once for every way a run is asked for: the command line builds it, the service takes it as its
    # request body, its client sends it, and a run's child gets it back as options (`study_run_argv`). Each field
    # is the option of its name, a field in seconds (`_s`) the option without the suffix.
    trials: Optional[int] = Field(None, ge=1, le=100_000, description="Default: 8, or with window_s as many as fit.")
    parallel: Optional[int] = Field(None, ge=1, le=4096)
    timeout_s: Optional[float] = Field(None, gt=0, le=1e8, description="Start no trial that would end later.")
    window_s: Optional[float] = Field(None, gt=0, le=1e8, description="As timeout_s, and stop any trial still "
                                                                       "running at its end.")
    budget_s: Optional[float] = Field(None, gt=0, le=1e9, description="Slot time (GPU time) the run may spend, "
                                                                       "summed over its slots, validation included.")
    prune: bool = True
    # `validate` itself would shadow BaseModel.validate; the JSON and the option keep the plain name.
    validate_: bool = Field(True, alias="validate", description="Then validate the best configurations against "
                                                                "vLLM's default (`tuner study validate`).")
    top: int = Field(DEFAULT_TOP, ge=1, le=100, description="Configurations to validate.")
    repeats: int = Field(DEFAULT_REPEATS, ge=2, le=100, description="Launches of each validated configuration and "
                                                                    "of the default.")
    pairing: bool = Field(True, description="Where the slot has a GPU and vLLM has sleep mode, validate one engine per "
                                            "configuration, the two taking turns; false: interleaved launches.")


def run_option(field: str) -> str:
    """The `tuner study run` option a RunRequest field (by its alias, if it has one) is given as."""
    return "--" + field.removesuffix("_s").replace("_", "-")


def study_run_argv(study: str, request: RunRequest, events: Path | None = None) -> list[str]:
    """`tuner study run` with --json and the request's options, as a process of its own; it appends each trial's
    start and end to `events`, if given. Options left unset (None) take the command's own defaults."""
    argv = [sys.executable, "-m", "tuner", "study", "run", study, "--json"]
    for field, value in request.model_dump(by_alias=True, exclude_none=True).items():
        option = run_option(field)
        if isinstance(value, bool):  # a flag: --prune or --no-prune
            argv.append(option if value else option.replace("--", "--no-", 1))
        else:
            argv += [option, str(value)]
    if events is not None:
        argv += ["--events", str(events)]
    return argv


class StudyRunChild:
    """One `tuner study run` child process, from its start to its end."""

    def __init__(self, process: subprocess.Popen, folder: Path):
        self.process, self.folder = process, folder
        self._stop_lock = threading.Lock()
        self._stopped_why: str | None = None
        self._ended = threading.Event()
        self._end: StudyRunEnd | None = None

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], folder: Path) -> StudyRunChild:
        """Start the child, its stdout and stderr going to files in `folder`; returns once it has started, or
        raises why it could not."""
        launched: Future[StudyRunChild] = Future()
        threading.Thread(target=cls._start_and_watch, args=(argv, env, folder, launched), daemon=True,
                         name=f"tuner-study-run-{folder.name}").start()
        return launched.result()

    @classmethod
    def _start_and_watch(cls, argv: list[str], env: dict[str, str], folder: Path, launched: Future) -> None:
        try:
            with open(folder / STDOUT_FILE, "wb") as stdout, open(folder / STDERR_FILE, "wb") as stderr:
                # A process group of its own: a Ray Serve replica that dies takes its group down 0.2 s after its
                # SIGTERM, too soon for the run to record its trials; tied to this thread, it is stopped properly.
                process = subprocess.Popen(tied_to_this_thread(argv), stdout=stdout, stderr=stderr,
                                           stdin=subprocess.DEVNULL, env=env, process_group=0)
        except BaseException as exc:
            launched.set_exception(exc)
            return
        child = cls(process, folder)
        launched.set_result(child)
        child._collect(process.wait())

    def _collect(self, exit_code: int) -> None:
        ended_at = time.time()
        text = (self.folder / STDOUT_FILE).read_text(errors="replace").strip()
        try:
            result = RunReport.from_dict(json.loads(text)) if text else None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            result = None  # not a run's report (a crash, an error's JSON): what went wrong is in its stderr
        with self._stop_lock:
            stopped_why = self._stopped_why
        state = (RunState.STOPPED if stopped_why is not None
                 else RunState.FINISHED if exit_code == 0 else RunState.FAILED)
        self._end = StudyRunEnd(state, exit_code, ended_at, stopped_why, result,
                                (self.folder / STDERR_FILE).read_text(errors="replace"))
        self._ended.set()

    @property
    def end(self) -> StudyRunEnd | None:
        """How the child ended; None while it runs."""
        return self._end

    def wait(self, timeout_s: float | None = None) -> StudyRunEnd | None:
        """How the child ended, once it has; None if it still runs after timeout_s."""
        self._ended.wait(timeout_s)
        return self._end

    def stop(self, why: str, grace_s: float = STOP_GRACE_S) -> None:
        """Tell the child to stop as Ctrl-C would (SIGTERM: it stops its trials and records them as stopped), and
        kill it if it has not ended within grace_s. Only the first call counts; a child that ended is left alone."""
        with self._stop_lock:
            if self._stopped_why is not None or self.process.poll() is not None:
                return
            self._stopped_why = why
        self.process.send_signal(signal.SIGTERM)
        threading.Thread(target=self._kill_unless_ended, args=(grace_s,), daemon=True,
                         name=f"tuner-study-run-stop-{self.folder.name}").start()

    def _kill_unless_ended(self, grace_s: float) -> None:
        if not self._ended.wait(grace_s):
            self.process.kill()
