"""Trials on Ray: one actor per slot, each running one trial at a time on its own node.

A slot is `tensor_parallel_size` GPUs of one node (Ray sets the actor's CUDA_VISIBLE_DEVICES, and the engine
inherits it), or a share of a machine's cores where there is no GPU. The replay client runs inside the actor,
on the engine's node, over loopback, so the network never enters the latency figures. What a trial wrote (log,
records) travels back with its result: nothing is left only on a worker's disk.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import ray
from ray.exceptions import RayActorError

from tuner.errors import TunerError
from workers.trial import ARTIFACTS, TrialOutcome, TrialSpec, run_trial

WorkerLost = RayActorError  # what ray.get raises when the actor (or its node) died mid-trial


@dataclass(frozen=True)
class Slot:
    index: int
    gpus: int  # GPUs of the slot (tensor_parallel_size), 0 for a CPU slot
    cpu_share: tuple[int, int] | None = None  # (k, n): the k-th of n CPU slots on one machine


@dataclass(frozen=True)
class WorkerResult:
    outcome: TrialOutcome
    files: dict[str, bytes]  # artifact name -> contents, for the driver's own artifact store
    node: str
    slot: int
    received_at: float  # time.time() when the worker took the trial (scheduling overhead is measured to it)


def _cpu_binding(share: tuple[int, int]) -> dict[str, str]:
    """Pin each CPU slot's engine to its own cores, so that two engines on one machine do not fight for one."""
    k, n = share
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // n)
    mine = cores[k * per:(k + 1) * per] or cores[-1:]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


class TrialWorker:
    """The Ray actor of one slot. Its methods run on the actor's main thread, which the engine's
    parent-death signal is tied to: if the actor dies, so does its engine."""

    def __init__(self, slot: Slot):
        self.slot = slot
        self.env = _cpu_binding(slot.cpu_share) if slot.cpu_share and slot.cpu_share[1] > 1 else {}

    def node(self) -> str:
        return platform.node()

    def run(self, spec: TrialSpec) -> WorkerResult:
        received = time.time()
        with tempfile.TemporaryDirectory(prefix="tuner-trial-") as tmp:
            outcome = run_trial(replace(spec, out_dir=Path(tmp), env={**spec.env, **self.env}))
            files = {name: (Path(tmp) / name).read_bytes() for name in ARTIFACTS if (Path(tmp) / name).exists()}
        return WorkerResult(outcome, files, platform.node(), self.slot.index, received)


def _connect(address: str | None, local_slots: int, gpus: int) -> bool:
    """Join the cluster at `address` (or RAY_ADDRESS), else start a local one; True if we started it."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    # Explicit resources: one CPU per slot (the engines' own threads are not Ray's to count).
    ray.init(num_cpus=max(local_slots, 1), num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    return True


class WorkerPool:
    """Slots across the cluster; `submit` runs a trial on a slot and gives a Ray reference to its result."""

    def __init__(self, parallel: int | None = None, *, ray_address: str | None = None,
                 tensor_parallel_size: int = 1, local_gpus: int = 0):
        self.tp = max(1, tensor_parallel_size)
        wanted = parallel or 0
        self._owned = _connect(ray_address, wanted or 1, local_gpus)
        cluster = ray.cluster_resources()
        gpu_slots = int(cluster.get("GPU", 0)) // self.tp
        if gpu_slots:
            count = min(wanted, gpu_slots) if wanted else gpu_slots
            self.slots = [Slot(i, self.tp) for i in range(count)]
        else:
            count = wanted or 1
            if count > int(cluster.get("CPU", 0)):
                raise TunerError(f"{count} CPU slots asked for, the Ray cluster has {int(cluster.get('CPU', 0))} CPUs")
            self.slots = [Slot(i, 0, (i, count)) for i in range(count)]
        if wanted and wanted > count:
            raise TunerError(f"{wanted} slots asked for, the Ray cluster has room for {count} "
                             f"(GPUs: {int(cluster.get('GPU', 0))}, tensor_parallel_size {self.tp})")
        self._actors = {slot.index: self._spawn(slot) for slot in self.slots}

    def _spawn(self, slot: Slot):
        options = {"num_gpus": slot.gpus, "num_cpus": 0 if slot.gpus else 1, "max_restarts": 0,
                   "max_concurrency": 1}
        return ray.remote(TrialWorker).options(**options).remote(slot)

    def submit(self, slot: int, spec: TrialSpec) -> ray.ObjectRef:
        return self._actors[slot].run.remote(spec)

    def replace_worker(self, slot: int) -> None:
        """A new actor for a slot whose worker was lost (on whatever node has room)."""
        self._actors[slot] = self._spawn(self.slots[slot])

    def kill_worker(self, slot: int) -> None:
        ray.kill(self._actors[slot], no_restart=True)

    def shutdown(self) -> None:
        """Kill every actor; each engine dies with its actor (parent-death signal), then Ray stops if ours."""
        for actor in self._actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # an actor already gone is what we wanted
                pass
        self._actors.clear()
        if self._owned:
            ray.shutdown()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
