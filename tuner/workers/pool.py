"""Trials on Ray: one actor per slot, each running one trial at a time on its own node.

A slot is `tensor_parallel_size` GPUs of one node (Ray sets the actor's CUDA_VISIBLE_DEVICES, and the engine
inherits it), or a share of a machine's cores where there is no GPU. The replay client runs inside the actor,
on the engine's node, over loopback, so the network never enters the latency figures.

What a trial writes (log, records) reaches the driver's trial folder however the trial ends. A worker on the
driver's node writes straight into it (local Ray: nothing to copy, and a log is readable there while it runs).
A worker on another node writes into a folder on that node named after the trial's folder (`_staging_dir`),
whose files travel back with the result; when the worker is killed or lost instead, the driver runs a small
task pinned to that node which sends back and deletes what was left (gone only if the node itself is gone).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import ray
from ray._private.state import available_resources_per_node  # public as a DeveloperAPI, not re-exported
from ray.exceptions import RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tuner.common.errors import TunerError
from tuner.workers.cpu_engine import cpu_engine_env, usable_cores
from tuner.workers.paired import EnginePair, PairedSpec, run_paired
from tuner.workers.probe_log import PROBE_LOG
from tuner.workers.trial import ARTIFACTS, TrialOutcome, TrialSpec, run_trial

WorkerLost = RayActorError  # what ray.get raises when the actor (or its node) died mid-trial
STAGING = Path(tempfile.gettempdir()) / "tuner-trials"
BRING_BACK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Slot:
    """One place in the pool where a trial runs: its index, its GPUs (0 for a CPU slot) and, for a CPU slot, its share
    of the machine's cores."""

    index: int
    gpus: int  # GPUs of the slot (tensor_parallel_size), 0 for a CPU slot
    cpu_share: tuple[int, int] | None = None  # (k, n): the k-th of n CPU slots on one machine


@dataclass(frozen=True)
class WorkerResult:
    """What a worker gives back for a trial: its outcome, the slot and node it ran on, and the artifacts to store when
    they were written off the driver's node."""

    outcome: TrialOutcome
    # artifact name -> contents, for the driver's own artifact store; empty when written there in place
    files: dict[str, bytes]
    node: str
    slot: int


@dataclass(frozen=True)
class PairedResult:
    """What a worker gives back for a paired validation (`workers.paired`): one result per arm of each round run in
    full, round by round, and why the rest could not run paired (None when every round ran)."""

    rounds: tuple[tuple[WorkerResult, ...], ...]
    fallback: str | None


def _staging_dir(out_dir: Path) -> Path:
    """Where a worker off the driver's node writes a trial: the driver's trial folder mirrored under this
    node's temporary folder, so that a driver can find what a killed trial left."""
    return STAGING / out_dir.relative_to(out_dir.anchor)


def _take_files(folder: Path, clear: bool = True) -> dict[str, bytes]:
    """The trial's files in staging `folder`, which is then deleted with the folders above it left empty (unless not
    `clear`: an engine held for more rounds still writes its log there)."""
    files = {name: (folder / name).read_bytes() for name in (*ARTIFACTS, PROBE_LOG) if (folder / name).exists()}
    if clear:
        _clear_staging(folder)
    return files


def _clear_staging(folder: Path) -> None:
    """Delete staging `folder`, and the folders above it left empty."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # stops at the first one not empty
        for parent in folder.relative_to(STAGING).parents[:-1]:
            (STAGING / parent).rmdir()


@ray.remote(num_cpus=0)
def _take_leftovers(out_dir: Path) -> dict[str, bytes]:
    """Run on a killed worker's node (its staging folder is found there, under that node's temporary folder)."""
    return _take_files(_staging_dir(out_dir))


def _cpu_share_env(share: tuple[int, int]) -> dict[str, str]:
    """A CPU slot's engine on its share of the cores (`cpu_engine_env`), unbound: pinned to cores of their own, two
    engines' front ends and replay clients fought both workers for a core (BENCHMARKS.md, "CPU engine threads")."""
    _, n = share
    return cpu_engine_env(os.environ, cores=max(1, usable_cores() // n))


class TrialWorker:
    """The Ray actor of one slot. Its methods run on the actor's main thread, which the engine's
    parent-death signal is tied to: if the actor dies, so does its engine."""

    def __init__(self, slot: Slot, driver_node: str):
        self.slot = slot
        self.env = _cpu_share_env(slot.cpu_share) if slot.cpu_share and slot.cpu_share[1] > 1 else {}
        self.on_driver_node = self.node_id() == driver_node
        self._pair: EnginePair | None = None  # engines held between paired calls (`run_paired` with keep)

    def node_id(self) -> str:
        """The Ray node id this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def _placed(self, spec: TrialSpec) -> TrialSpec:
        """`spec` as this slot runs it: on its share of the CPU and, off the driver's node, written in staging."""
        out_dir = spec.out_dir if self.on_driver_node else _staging_dir(spec.out_dir)
        return replace(spec, out_dir=out_dir, env={**spec.env, **self.env})

    def _files(self, spec: TrialSpec, clear: bool = True) -> dict[str, bytes]:
        """The files of placed `spec` for the driver: none on its node (they are in place)."""
        return {} if self.on_driver_node else _take_files(spec.out_dir, clear)

    def run(self, spec: TrialSpec) -> WorkerResult:
        """Run `spec` on this slot (on its share of the CPU) and return the outcome; off the driver's node the trial
        is written in staging and its files come back in the result. run_trial's errors propagate."""
        placed = self._placed(spec)
        try:
            outcome = run_trial(placed)
        finally:
            files = self._files(placed)
        return WorkerResult(outcome, files, platform.node(), self.slot.index)

    def run_paired(self, spec: PairedSpec, keep: bool = False) -> PairedResult:
        """Run the rounds of `spec` paired on this slot (`EnginePair`): on the engines this actor holds from an earlier
        call (launched for the same configurations), else on engines launched from its first round; each round's
        files as `run` has a trial's. With `keep`, the engines are held for the next call where every round ran."""
        placed = PairedSpec(tuple(tuple(self._placed(s) for s in specs) for specs in spec.rounds))
        pair, self._pair = self._pair or EnginePair(placed.rounds[0]), None
        try:
            outcome = run_paired(placed, pair=pair, keep=keep)
            if keep and outcome.fallback is None:
                self._pair = pair
        finally:
            files = [[self._files(s, clear=self._pair is None) for s in specs] for specs in placed.rounds]
            if self._pair is None and not self.on_driver_node:
                for first in pair.first:  # the held engines' logs, left in staging while they ran
                    _clear_staging(first.out_dir)
        node = platform.node()
        rounds = tuple(tuple(WorkerResult(arm_outcome, arm_files, node, self.slot.index)
                             for arm_outcome, arm_files in zip(round_outcomes, round_files))
                       for round_outcomes, round_files in zip(outcome.rounds, files))
        return PairedResult(rounds, outcome.fallback)

    def release_pair(self) -> None:
        """Stop the engines held from a paired call, if any."""
        pair, self._pair = self._pair, None
        if pair is not None:
            pair.stop()
            if not self.on_driver_node:
                for first in pair.first:
                    _clear_staging(first.out_dir)


def connect_ray(address: str | None, num_cpus: int | None, num_gpus: int | None = None) -> bool:
    """Join the Ray cluster at `address` (or $RAY_ADDRESS), else start a local one with `num_cpus` CPUs and
    `num_gpus` GPUs (None: those Ray detects); True if this call started the cluster. Nothing happens, and False
    is returned, if this process is connected already. The one place a tuner process connects to Ray."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    # address="local": a new cluster of our own, never one that `ray start` left recorded on this machine.
    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False)
    return True


class WorkerPool:
    """Slots across the cluster; `submit` runs a trial on a slot and gives a Ray reference to its result."""

    def __init__(self, parallel: int | None = None, *, ray_address: str | None = None,
                 tensor_parallel_size: int = 1, local_gpus: int = 0):
        self.tp = max(1, tensor_parallel_size)
        wanted = parallel or 0
        # Explicit resources: one CPU per slot (the engines' own threads are not Ray's to count).
        self._owned = connect_ray(ray_address, wanted or 1, local_gpus)
        cluster = ray.cluster_resources()
        gpu_capacity = int(cluster.get("GPU", 0)) // self.tp
        if gpu_capacity:
            # By default the slots free now; a slot's GPUs must all be on one node.
            count = wanted or sum(int(free.get("GPU", 0)) // self.tp
                                  for free in available_resources_per_node().values())
            if not count:
                raise TunerError(f"no {self.tp} GPUs of one node are free now; --parallel N waits for N slots")
            if count > gpu_capacity:
                raise TunerError(f"{count} slots asked for, the Ray cluster has room for {gpu_capacity} "
                                 f"(GPUs: {int(cluster.get('GPU', 0))}, tensor_parallel_size {self.tp})")
            self.slots = [Slot(i, self.tp) for i in range(count)]
        else:
            count = wanted or 1  # one engine on all of a machine's cores, unless asked otherwise
            if count > int(cluster.get("CPU", 0)):
                raise TunerError(f"{count} CPU slots asked for, the Ray cluster has {int(cluster.get('CPU', 0))} CPUs")
            self.slots = [Slot(i, 0, (i, count)) for i in range(count)]
        self._driver_node = ray.get_runtime_context().get_node_id()
        self._actors: dict[int, ray.actor.ActorHandle] = {}
        self._nodes: dict[int, ray.ObjectRef] = {}  # slot -> its actor's node id, asked for on creation
        self._out_dirs: dict[int, Path] = {}  # slot -> the driver's folder of the trial it was last given
        for slot in self.slots:
            self._spawn(slot)

    def _spawn(self, slot: Slot, prefer_node: str | None = None) -> None:
        options = {"num_gpus": slot.gpus, "num_cpus": 0 if slot.gpus else 1, "max_restarts": 0,
                   "max_concurrency": 1}
        if prefer_node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(prefer_node, soft=True)
        actor = ray.remote(TrialWorker).options(**options).remote(slot, self._driver_node)
        self._actors[slot.index] = actor
        self._nodes[slot.index] = actor.node_id.remote()  # runs before any trial: actor calls run in order

    def node_id(self, slot: int) -> str | None:
        """The Ray node of the slot's actor (also once the actor is dead); None if it never started."""
        try:
            return ray.get(self._nodes[slot], timeout=BRING_BACK_TIMEOUT_S)
        except RayError:
            return None

    def submit(self, slot: int, spec: TrialSpec) -> ray.ObjectRef:
        """Start `spec` on the slot's actor (its out_dir made absolute): a Ray reference to the WorkerResult; ray.get
        raises WorkerLost if the actor dies meanwhile."""
        # Absolute: a worker on this node writes there, from its own working folder.
        spec = replace(spec, out_dir=spec.out_dir.absolute())
        self._out_dirs[slot] = spec.out_dir
        return self._actors[slot].run.remote(spec)

    def run_paired(self, slot: int, spec: PairedSpec, stop_reason: Callable[[], str | None],
                   poll_s: float, keep: bool = False) -> PairedResult | str:
        """Run the paired rounds of `spec` on the slot's actor (`TrialWorker.run_paired`, its folders made absolute):
        on the engines it holds from a call with `keep`, else on new ones; with `keep`, its engines are held for the
        next call. Waits for it, asking `stop_reason` every `poll_s` seconds: once it gives one, the actor is killed
        (and every engine with it) and the reason returned. Raises WorkerLost if the actor dies meanwhile."""
        spec = PairedSpec(tuple(tuple(replace(s, out_dir=s.out_dir.absolute()) for s in specs)
                                for specs in spec.rounds))
        self._out_dirs[slot] = spec.rounds[0][0].out_dir
        ref = self._actors[slot].run_paired.remote(spec, keep)
        while True:
            ready, _ = ray.wait([ref], timeout=poll_s)
            if ready:
                return ray.get(ref)
            reason = stop_reason()
            if reason is not None:
                self.kill_worker(slot)
                return reason

    def release_pair(self, slot: int) -> None:
        """Stop the engines the slot's actor holds (`run_paired` with keep); where it does not answer, kill it."""
        try:
            ray.get(self._actors[slot].release_pair.remote(), timeout=BRING_BACK_TIMEOUT_S)
        except RayError:
            self.kill_worker(slot)

    def bring_back_files(self, slot: int) -> None:
        """Into the driver's trial folder, what the slot's last trial left on its worker's node, once that worker
        was killed or lost. Nothing to do on the driver's node (the files are already there) or for a node that
        is gone (so are they)."""
        node, out_dir = self.node_id(slot), self._out_dirs.get(slot)
        if node is None or node == self._driver_node or out_dir is None:
            return
        if not any(n["NodeID"] == node and n["Alive"] for n in ray.nodes()):
            return
        task = _take_leftovers.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
        try:
            files = ray.get(task.remote(out_dir), timeout=BRING_BACK_TIMEOUT_S)
        except RayError:  # the node went away meanwhile
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (out_dir / name).write_bytes(data)

    def replace_worker(self, slot: int) -> None:
        """A new actor for a slot whose worker was lost, once what its trial left is brought back: preferably on
        another node with room (Ray has no anti-affinity: a soft affinity to such a node), else wherever Ray
        finds room, the same node included."""
        self.bring_back_files(slot)
        lost = self.node_id(slot)
        need = ("GPU", self.slots[slot].gpus) if self.slots[slot].gpus else ("CPU", 1)
        others = [node for node, free in available_resources_per_node().items()
                  if node != lost and free.get(need[0], 0) >= need[1]]
        self._spawn(self.slots[slot], others[0] if others else None)

    def kill_worker(self, slot: int) -> None:
        """Kill the slot's actor, and with it its engine; Ray does not restart it (replace_worker gives the slot a new
        one)."""
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
