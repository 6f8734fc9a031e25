"""The threads of a vLLM engine on the CPU build, as tuner launches it.

Left to itself, vLLM's CPU build starts three processes (API server, engine core, worker) and binds the worker's
OpenMP threads to cores of its choosing. On a small machine whose other core is busy, that worker can be bound to
the busy core, and OpenMP threads that share busy cores wait on each other at every barrier: two engines left at
two threads each on two cores decoded twelve times slower (BENCHMARKS.md, "CPU engine threads"). So a CPU engine
runs its worker inside the engine core, as a one-GPU engine does (one process fewer to start), on half the cores
this process may use, at least one: in that mode vLLM binds no thread, so the kernel moves them off a busy core.
A user who chooses vLLM's own layout (VLLM_ENABLE_V1_MULTIPROCESSING or VLLM_CPU_OMP_THREADS_BIND set) keeps it
whole. OMP_NUM_THREADS set alone is no such choice: Ray sets it in every worker, where studies launch engines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tuner.common.hardware import detect_hardware

# vLLM's CPU build reads these (envs.py): the worker in the engine core's process or its own; the cores its own
# process's OpenMP threads are bound to; and OpenMP's own count, which in-process mode leaves to the environment.
IN_PROCESS_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"
BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
THREADS_VAR = "OMP_NUM_THREADS"
LAYOUT_VARS = (IN_PROCESS_VAR, BIND_VAR)  # either set: the user chose vLLM's own layout


def usable_cores() -> int:
    """The cores this process may run on (its affinity; all of the machine's where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_engine_threads(cores: int) -> int:
    """OpenMP threads for one engine on `cores` usable cores: half, at least one, so that one busy core leaves each
    thread a core of its own."""
    return max(1, cores // 2)


def cpu_engine_env(environ: Mapping[str, str], cores: int | None = None) -> dict[str, str]:
    """What a CPU engine's environment adds to `environ` (the one it would otherwise start with): nothing on a GPU
    machine, nor where the user chose vLLM's own layout (LAYOUT_VARS). `cores`: how many it may use (a CPU slot's
    share); default: all this process may use."""
    if detect_hardware().accelerator != "cpu" or any(var in environ for var in LAYOUT_VARS):
        return {}
    return {IN_PROCESS_VAR: "0", THREADS_VAR: str(cpu_engine_threads(cores or usable_cores()))}
