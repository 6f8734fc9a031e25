"""Why an engine failed, told from its exit status and its log: never a silent zero score."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum


class FailureClass(str, Enum):
    """Why an engine failed; a str, stored as its value (the trial's failure class)."""

    KV_INSUFFICIENT = "kv_insufficient"  # max_model_len cannot fit in the KV budget
    LOAD_OOM = "load_oom"  # weights or the memory reservation do not fit
    INVALID_CONFIG = "invalid_config"  # vLLM rejected the settings
    STARTUP_TIMEOUT = "startup_timeout"  # no healthy server within the time allowed
    STARTUP_CRASH = "startup_crash"  # exited during start for a reason not recognized above
    ENGINE_DIED = "engine_died"  # was serving, then exited or stopped answering during replay


@dataclass(frozen=True)
class EngineFailure:
    """An engine that failed to start or to keep serving: its class, a line for people, and the log lines that show
    why."""

    kind: FailureClass
    message: str  # one line for people
    exit_code: int | None
    log_excerpt: str
    estimated_max_model_len: int | None = None  # vLLM's own estimate, for kv_insufficient

    def to_dict(self) -> dict:
        """JSON-ready, the kind as its value: the `failure` of a trial's measurement.json."""
        data = asdict(self)
        data["kind"] = self.kind.value
        return data


_KV_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
_PATTERNS: list[tuple[FailureClass, re.Pattern[str]]] = [
    (FailureClass.KV_INSUFFICIENT, re.compile(
        r"estimated maximum model length is \d+|larger than the available KV cache memory"
        r"|No available memory for the cache blocks|Insufficient memory for KV cache")),
    (FailureClass.LOAD_OOM, re.compile(
        r"CUDA out of memory|OutOfMemoryError|Cannot allocate memory|MemoryError"
        r"|is less than desired (?:CPU|GPU) memory utilization|Not enough memory")),
    (FailureClass.INVALID_CONFIG, re.compile(
        r"api_server\.py: error:|: error: argument|ValidationError|ValueError|Value error, |NotImplementedError"
        r"|is not supported|Unsupported|Invalid value")),
]

EXCERPT_LINES = 30
SIGKILLED = (128 + 9, -9)  # exit codes of a process killed by SIGKILL (through the engine guard, or directly)


def _excerpt(lines: list[str], hit: int | None) -> str:
    """The lines around the decisive one (or the log's tail), so the reason can be read without the log."""
    if hit is None:
        return "\n".join(lines[-EXCERPT_LINES:])
    start = max(0, hit - EXCERPT_LINES // 2)
    return "\n".join(lines[start:hit + EXCERPT_LINES // 2])


def classify_failure(exit_code: int | None, log_text: str, *, timed_out: bool = False,
                     was_serving: bool = False) -> EngineFailure:
    """Name the failure of an engine launch.

    `was_serving`: it had answered /health before it stopped, so whatever the log says, users saw a
    server die mid-traffic.
    """
    lines = log_text.splitlines()
    if was_serving:
        return EngineFailure(FailureClass.ENGINE_DIED, f"the engine stopped during replay (exit code {exit_code})",
                             exit_code, _excerpt(lines, None))
    if timed_out:
        return EngineFailure(FailureClass.STARTUP_TIMEOUT, "the engine did not become healthy in time",
                             exit_code, _excerpt(lines, None))
    for kind, pattern in _PATTERNS:
        # The last match is the one closest to the exit, past any warnings that merely mention a word.
        hits = [i for i, line in enumerate(lines) if pattern.search(line)]
        if not hits:
            continue
        # The message after vLLM's log prefix and exception name: "ValueError: To serve at least ...".
        line = re.sub(r"^.*?\b\w*(?:Error|Exception): ", "", lines[hits[-1]].strip(), count=1)
        estimate = None
        if kind is FailureClass.KV_INSUFFICIENT:
            found = [m for m in (_KV_ESTIMATE.search(x) for x in lines) if m]
            estimate = int(found[-1].group(1)) if found else None
        return EngineFailure(kind, line[:400], exit_code, _excerpt(lines, hits[-1]), estimate)
    if exit_code in SIGKILLED:
        # The kernel's out-of-memory killer leaves no line in the log: only the SIGKILL it sent.
        return EngineFailure(FailureClass.LOAD_OOM, f"the engine was killed by SIGKILL during startup (exit code "
                             f"{exit_code}), most likely by the out-of-memory killer", exit_code,
                             _excerpt(lines, None))
    return EngineFailure(FailureClass.STARTUP_CRASH, f"the engine exited during startup (exit code {exit_code})",
                         exit_code, _excerpt(lines, None))
