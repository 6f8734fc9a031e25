"""tuner.supervisor on stand-ins for `tuner study run` (small Python programs): how a child's end is collected,
that a stopped child is killed when it outlasts its grace, and that a child dies with the process watching it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tuner.study.events import RunReport
from tuner.supervisor import RunState, StudyRunChild

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
                  "time.sleep(60)"


def start(code: str, folder: Path) -> StudyRunChild:
    folder.mkdir()
    return StudyRunChild.start([sys.executable, "-c", code], dict(os.environ), folder)


def test_the_end_says_what_the_child_printed_and_how_it_exited(tmp_path):
    report = RunReport([], "the time budget was spent", "not validated")
    done = start(f"print({json.dumps(report.to_dict())!r})", tmp_path / "done").wait(30)
    assert (done.state, done.exit_code, done.result, done.stopped_why) == (RunState.FINISHED, 0, report, None)
    # JSON that is no run's report (an error's, say) is no result: what went wrong is in the child's stderr.
    other = start("import json, sys; print(json.dumps({'error': 'x'})); sys.exit(1)", tmp_path / "other").wait(30)
    assert (other.state, other.result) == (RunState.FAILED, None)
    failed = start("import sys; sys.exit('error: no study named s')", tmp_path / "failed").wait(30)
    assert (failed.state, failed.exit_code, failed.result, failed.stderr) == (RunState.FAILED, 1, None,
                                                                             "error: no study named s\n")
    assert failed.failure_reason() == "no study named s"


def test_a_child_that_dies_without_naming_an_error_is_said_to_have_died_so(tmp_path):
    # Ray's log line is the last thing such a child printed: it is shown as that, never as the reason.
    code = ("import os, signal, sys; print('INFO worker.py -- Connected to Ray cluster.', file=sys.stderr, "
            "flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    killed = start(code, tmp_path / "killed").wait(30)
    assert killed.state is RunState.FAILED and killed.exit_code == -signal.SIGKILL
    assert killed.failure_reason() == ("`tuner study run` ended (killed by SIGKILL) without naming an error; the "
                                       "last line it printed: INFO worker.py -- Connected to Ray cluster.")
    silent = start("import sys; sys.exit(3)", tmp_path / "silent").wait(30)
    assert silent.failure_reason() == "`tuner study run` ended (exit code 3) without naming an error, having " \
                                      "printed nothing"


def test_a_stopped_child_that_outlasts_its_grace_is_killed(tmp_path):
    child = start(IGNORES_SIGTERM, tmp_path / "stubborn")
    while not (tmp_path / "stubborn" / "stdout.json").read_text():
        time.sleep(0.05)
    assert child.wait(0.2) is None and child.end is None
    child.stop("asked to", grace_s=1)
    child.stop("asked again")  # only the first call counts
    end = child.wait(30)
    assert (end.state, end.exit_code, end.stopped_why) == (RunState.STOPPED, -signal.SIGKILL, "asked to")


def test_a_child_is_told_to_stop_when_the_process_watching_it_dies(tmp_path):
    code = ("import os, sys, time; from pathlib import Path; from tuner.supervisor import StudyRunChild; "
            "child = StudyRunChild.start([sys.executable, '-c', 'import time; time.sleep(60)'], dict(os.environ), "
            f"Path({str(tmp_path)!r})); print(child.process.pid, flush=True); time.sleep(60)")
    watcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(watcher.stdout.readline()))
    watcher.kill()  # no cleanup runs: only the kernel can tell the child
    watcher.wait()
    psutil.wait_procs([child], timeout=10)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def _start_beside_an_aborting_at_fork_handler(folder: Path, *, vfork: bool) -> str:
    """How a child ended, started by a process holding an at-fork handler that aborts: `state exit_code`."""
    code = (f"import ctypes, os, subprocess, sys; from pathlib import Path; subprocess._USE_VFORK = {vfork}; "
            "from tuner.supervisor import StudyRunChild; libc = ctypes.CDLL('libc.so.6'); "
            "assert libc.__register_atfork(None, None, ctypes.cast(libc.abort, ctypes.c_void_p), None) == 0; "
            "end = StudyRunChild.start([sys.executable, '-c', 'print(42)'], dict(os.environ), "
            f"Path({str(folder)!r})).wait(60); print(end.state, end.exit_code)")
    folder.mkdir()
    driver = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert driver.returncode == 0, driver.stderr
    return driver.stdout.strip()


def test_a_child_starts_even_when_its_launcher_holds_an_at_fork_handler_that_aborts(tmp_path):
    # In a Ray Serve replica grpc's at-fork handler once aborted a `tuner study run` before it could exec (CI,
    # 2026-12-05). A handler that always aborts stands in for it.
    assert _start_beside_an_aborting_at_fork_handler(tmp_path / "started", vfork=True) == "finished 0"
    assert (tmp_path / "started" / "stdout.json").read_text() == "42\n"
    # The stand-in is real: a child this launcher forks (as a preexec_fn would make it) dies of it.
    assert _start_beside_an_aborting_at_fork_handler(tmp_path / "forked", vfork=False) == f"failed {-signal.SIGABRT}"
