"""Shared fixtures: the tiny model, the real traces, the check that no engine outlives a test, and a watch on
the processes a driver starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

# PostgreSQL: the `postgres_url` (session) and `postgres_database` (per test) fixtures.
pytest_plugins = ["postgres"]

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
AZURE_CONV = TRACES / "azure_conv_2023.csv"
# For tests about anything but the boundary: with the latency limits lifted no trial is pruned or judged
# infeasible for being slow, however loaded the machine. The completion limit stays.
NO_LATENCY_LIMITS = {"ttft_p95_s": None, "e2e_p95_s": None}
NO_LATENCY_LIMIT_ARGS = ("--limit", "ttft_p95_s=none", "--limit", "e2e_p95_s=none")
# For tests about anything but the load search: one replay per trial at the reference load, as before probes.
FIXED_LOAD = ("--load", "fixed")


# Every process this test process starts carries this mark in its environment (vLLM, Ray's workers and services
# inherit it), so that the checks below count its own engines alone: not those of the other xdist worker, of
# another test run, or a vLLM someone serves on the machine. Set anew in each worker, not inherited.
RUN_MARK = "TUNER_TEST_RUN"
os.environ[RUN_MARK] = uuid.uuid4().hex


def vllm_processes() -> list[psutil.Process]:
    """Every live vLLM server or engine-core process this test run started, whatever became of its parent.

    A zombie is left out: it has exited and holds nothing but its exit status. One whose parent died is
    reparented to PID 1, and a container's PID 1 need not reap it."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            if ("vllm.entrypoints" in cmdline or (proc.info["name"] or "").startswith("VLLM")) and (
                    proc.environ().get(RUN_MARK) == os.environ[RUN_MARK]):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _alive(proc: psutil.Process) -> bool:
    try:  # is_running() also checks the start time, so a reused PID is not taken for the process seen
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class DescendantWatch(threading.Thread):
    """Records every process below `root` while it runs (Ray's gcs_server, raylet and workers, vLLM, ...): one
    that outlives `root` is no longer below it, so it must be seen while it is."""

    def __init__(self, root: int, interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.interval_s = psutil.Process(root), interval_s
        self.seen: dict[int, tuple[psutil.Process, str]] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set() and _alive(self.root):
            try:
                below = self.root.children(recursive=True)
            except psutil.Error:
                break
            for proc in below:
                # Read again on every pass: a process caught between fork and exec still shows its parent's
                # command line (on a busy machine, Ray's gcs_server and raylet often are).
                try:
                    command = " ".join(proc.cmdline())[:200] or proc.name()
                except psutil.Error:
                    continue
                self.seen[proc.pid] = (self.seen[proc.pid][0] if proc.pid in self.seen else proc, command)
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join(10)

    def left_alive(self, grace_s: float = 10.0) -> list[tuple[int, str]]:
        """Those seen that are still alive `grace_s` after the root exited (time for SIGTERMed ones to end)."""
        self.stop()
        deadline = time.monotonic() + grace_s
        while (left := [(p.pid, cmd) for p, cmd in self.seen.values() if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def assert_none_left(watch: DescendantWatch) -> list[str]:
    """No process the driver started outlives it; the driver's own Ray cluster was among those watched, so an
    empty list is not a watch that saw nothing. Returns the programs watched, for the record."""
    left = watch.left_alive()
    commands = [cmd for _, cmd in watch.seen.values()]
    assert any("gcs_server" in cmd for cmd in commands) and any("raylet" in cmd for cmd in commands), commands
    assert not left, f"{len(left)} of the driver's {len(commands)} processes outlived it: {left}"
    return sorted(map(_program, commands))


def _program(command: str) -> str:
    """A short name for a command line: the binary, the Python module, script or `-c` module imported from."""
    parts = command.split() or ["?"]
    if "python" not in Path(parts[0]).name:
        return Path(parts[0]).name
    for i, part in enumerate(parts[1:], 1):
        if part == "-m" and i + 1 < len(parts):
            return parts[i + 1]
        if part == "-c":
            return parts[i + 2] if parts[i + 1:i + 2] == ["from"] and i + 2 < len(parts) else "python -c"
        if not part.startswith("-"):
            return Path(part).name
    return "python"


# Files whose tests start a Ray Serve service: one worker runs them, one after another.
SERVE_FILES = ("test_service", "test_secrets")


# The files of longest test time, longest first (BENCHMARKS.md, "Test suite time"): they start first, so that
# neither worker is left with one of them while the other has nothing more to take.
LONGEST_FIRST = ("test_main_job", "test_validation_vllm", "test_report_vllm", "test_study_vllm",
                 "test_capacity_vllm", "test_workers_ray", "test_engine_faults", "test_budget_vllm", "test_schedules")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's `--dist loadgroup`: a file to a group, so that a module's fixtures are made once
    and its tests keep their order; the files that start a Ray Serve service in one group. The longest files
    come first (a stable sort: every file's tests keep their order)."""
    for item in items:
        module = item.module.__name__
        item.add_marker(pytest.mark.xdist_group("serve" if module in SERVE_FILES else module))
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(rank)))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tuner.common.models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(autouse=True)
def no_engine_left_behind(request):
    """After every test that launches vLLM, no vLLM process may remain."""
    yield
    if request.node.get_closest_marker("vllm") is None:
        return
    deadline = time.monotonic() + 5
    while vllm_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = vllm_processes()
    assert not left, f"vLLM processes left behind: {[(p.pid, p.name()) for p in left]}"


def as_at_a_terminal() -> None:
    """preexec_fn of a driver the tests interrupt: SIGINT at its default, as for a user pressing Ctrl-C. A shell
    starts background jobs with SIGINT ignored and Python keeps an ignored SIGINT: a suite run in the background
    would hand that on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_when_ready(proc: subprocess.Popen, ready, sig: int, timeout_s: float = 120) -> tuple[str, str]:
    """Once `ready()` has returned, send `sig` to `proc` and collect its output. A process still alive when this
    ends (a wait that failed, a stop that hung) is killed: no test leaves one behind."""
    try:
        ready()
        proc.send_signal(sig)
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()


def run_tuner(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    """The `tuner` command line as a user runs it; a non-zero exit fails the test with its stderr. `timeout_s` is a
    guard against a hung command, never a speed test: commands of many launches give it room for a slow machine."""
    result = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# Headless Chromium (Debian's) as the tests drive it, with nothing reaching the network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@dataclass
class Dashboard:
    url: str
    output: str = ""  # its stdout and stderr, once stopped


@contextmanager
def running_dashboard(common: list[str] | tuple[str, ...]) -> Iterator[Dashboard]:
    """`tuner dashboard` over a study's storage (`common`: its --storage and --artifacts) on a free port, once
    its API answers; stopped on leaving, its output then in `.output`."""
    from tuner.workers.launch import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "dashboard", "--port", str(port), *common],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dashboard = Dashboard(f"http://127.0.0.1:{port}")
    try:
        for _ in range(150):
            try:
                httpx.get(f"{dashboard.url}/api/meta").raise_for_status()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.2)
        yield dashboard
    finally:
        proc.terminate()
        dashboard.output, _ = proc.communicate(timeout=10)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path: Path) -> str:
    """A fresh database for tuner's storage: an SQLite file, then a PostgreSQL database of its own."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_database")
    return f"sqlite:///{tmp_path / 'tuner.db'}"
