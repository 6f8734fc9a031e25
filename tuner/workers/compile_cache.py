"""vLLM's compile cache: one folder per worker node, kept across trials so that an engine shape compiled once
starts warm; and whether a launch found it warm, read from vLLM's own log."""

from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path

from tuner.common.paths import tuner_home

CACHE_ROOT_VAR = "VLLM_CACHE_ROOT"  # vLLM keeps torch.compile's artifacts (inductor's, Triton's) under it

# vLLM's log lines (0.24 and 0.32 alike; 0.32 puts a prefix before each): a graph compiled (piecewise, or whole
# and saved ahead of time, the CPU build's way, or again after a cached one failed to load), or loaded compiled.
_COMPILED = re.compile(r"Compiling a graph for .* takes [\d.]+ s|saved AOT compiled function to |"
                       r"Compiling model again due to a load failure")
_LOADED = re.compile(r"Directly load the compiled graph\(s\) for |Directly load AOT compilation from path ")


class CompileCache(str, Enum):
    """How a launch's engine came by its compiled graphs."""

    WARM = "warm"  # every graph came from the cache
    COLD = "cold"  # at least one graph was compiled at startup
    UNUSED = "unused"  # nothing compiled: eager mode, or the engine died before compiling


def engine_cache_root() -> Path:
    """This node's compile cache: under tuner's home, so that every trial on the node shares it."""
    return tuner_home() / "engine-cache"


def engine_cache_env() -> dict[str, str]:
    """The environment an engine is launched with for the cache: tuner's folder, unless the user chose one."""
    return {} if os.environ.get(CACHE_ROOT_VAR) else {CACHE_ROOT_VAR: str(engine_cache_root())}


def compile_cache_state(log_text: str) -> CompileCache:
    """Warm, cold or unused, from the server's log."""
    if _COMPILED.search(log_text):
        return CompileCache.COLD
    return CompileCache.WARM if _LOADED.search(log_text) else CompileCache.UNUSED
