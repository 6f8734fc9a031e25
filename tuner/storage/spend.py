"""What a study's answer cost: its slots' time (GPU time on GPUs) by what it went to, per trial and in total, read
from its stored trials and runs.

A trial's own time splits into its engine's start and stop, its probes' arrivals (the load it was measured at),
and the rest of its replays (draining): each probe's tail after its last arrival, the waits for an idle engine
before each probe, and the warm-up. The time a run held its slots beyond its trials' own is idle: Ray's start,
scheduling, the driver's scoring, a slot waiting for the next trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tuner.common.durations import format_duration
from tuner.storage.records import StoredRun, StoredTrial
from tuner.workers.compile_cache import CompileCache


def slot_unit(gpus_per_slot: int) -> str:
    """What one slot-second is: GPU time where slots are GPUs, else a CPU slot's."""
    return "GPU" if gpus_per_slot else "CPU slot"


@dataclass(frozen=True)
class GpuTime:
    """Slot time by what it went to, in seconds (summed over slots)."""

    startup_s: float = 0.0  # engines starting and stopping
    probes_s: float = 0.0  # requests arriving at the probes' loads
    draining_s: float = 0.0  # the rest of the replays: tails after the last arrival, waits for an idle engine, warm-ups
    idle_s: float = 0.0  # held by a run, running no trial

    @property
    def total_s(self) -> float:
        """All of it."""
        return self.startup_s + self.probes_s + self.draining_s + self.idle_s

    def __add__(self, other: GpuTime) -> GpuTime:
        return GpuTime(self.startup_s + other.startup_s, self.probes_s + other.probes_s,
                       self.draining_s + other.draining_s, self.idle_s + other.idle_s)

    @classmethod
    def of_trial(cls, trial: StoredTrial) -> GpuTime:
        """A trial's own time; nothing for one refused before launch. Probes an earlier launch measured (a re-run
        goes on after them) took none of this launch's time."""
        t = trial.timings
        if t is None:
            return cls()
        arrivals = 0.0
        for judged in trial.probes:
            m = judged.probe.measurement
            if m is None or judged.probe.earlier_trial is not None:
                continue
            arrivals += m.pace.window_s if m.pace is not None else m.duration_s
        probes_s = min(arrivals, t.replay_s)
        return cls(startup_s=t.startup_s + t.teardown_s, probes_s=probes_s, draining_s=t.replay_s - probes_s)

    def to_dict(self) -> dict[str, float]:
        """Each part and the total, in seconds."""
        return {**asdict(self), "total_s": self.total_s}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> GpuTime:
        """The time `to_dict` gave (the total is computed again, not read)."""
        return cls(data["startup_s"], data["probes_s"], data["draining_s"], data["idle_s"])

    def text(self) -> str:
        """`12m30s: startup 4m10s, probes 6m02s, draining 1m48s, idle 30s`."""
        parts = {"startup": self.startup_s, "probes": self.probes_s, "draining": self.draining_s,
                 "idle": self.idle_s}
        return f"{format_duration(self.total_s)}: " + ", ".join(f"{name} {format_duration(s)}"
                                                                 for name, s in parts.items())


@dataclass(frozen=True)
class TrialSpend:
    """One trial's time, and how its engine came by its compiled graphs (cold: compiled at startup)."""

    trial_number: int
    gpu_time: GpuTime
    compile_cache: CompileCache
    validation: bool  # a validation launch

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the trial, its time's parts and total, its compile cache and whether it validated."""
        return {"trial": self.trial_number, **self.gpu_time.to_dict(), "compile_cache": self.compile_cache.value,
                "validation": self.validation}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpend:
        """The trial's time `to_dict` gave."""
        return cls(data["trial"], GpuTime.from_dict(data), CompileCache(data["compile_cache"]), data["validation"])


@dataclass(frozen=True)
class Spend:
    """A study's time: each launched trial's, the runs' idle time, and the total; in GPU time where its slots were
    GPUs (`unit`)."""

    unit: str  # "GPU" or "CPU slot": what one slot-second is
    trials: tuple[TrialSpend, ...]
    idle_s: float  # the runs' slot time beyond their trials' (0 for trials run before runs were kept)
    runs: int  # runs kept

    @property
    def total(self) -> GpuTime:
        """The trials' time and the idle, together."""
        summed = GpuTime(idle_s=self.idle_s)
        for t in self.trials:
            summed += t.gpu_time
        return summed

    def starts(self, cache: CompileCache) -> int:
        """How many launches found the compile cache so (cold: compiled at startup; warm: loaded every graph)."""
        return sum(t.compile_cache is cache for t in self.trials)

    @classmethod
    def of(cls, trials: Sequence[StoredTrial], runs: Sequence[StoredRun]) -> Spend:
        """From the study's stored trials and runs. The unit is the slots' kind of its runs, else of its trials'
        hardware."""
        launched = [t for t in trials if t.timings is not None]
        own = {t.trial_number: GpuTime.of_trial(t) for t in launched}
        idle = sum(max(0.0, run.held_s - sum(own[n].total_s for n in run.trials if n in own)) for run in runs)
        gpus = any(run.gpus_per_slot for run in runs) or any(t.hardware is not None and t.hardware.gpu_count
                                                              for t in launched)
        return cls(slot_unit(int(gpus)),
                   tuple(TrialSpend(t.trial_number, own[t.trial_number], t.timings.compile_cache,
                                    t.validation is not None) for t in launched if t.timings is not None),
                   idle, len(runs))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the unit, the total by part, the starts by compile cache, the runs kept, each trial's time
        and the sentence."""
        return {"unit": self.unit, "total": self.total.to_dict(), "cold_starts": self.starts(CompileCache.COLD),
                "warm_starts": self.starts(CompileCache.WARM), "runs": self.runs,
                "trials": [t.to_dict() for t in self.trials], "idle_s": self.idle_s, "text": self.text()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spend:
        """The spend `to_dict` gave (its total and text are computed again, not read)."""
        return cls(data["unit"], tuple(TrialSpend.from_dict(t) for t in data["trials"]), data["idle_s"], data["runs"])

    def text(self) -> str:
        """`GPU time 12m30s: startup 4m10s, probes 6m02s, draining 1m48s, idle 30s; 5 launches, 2 cold starts, 3
        warm`."""
        cold, warm = self.starts(CompileCache.COLD), self.starts(CompileCache.WARM)
        starts = f", {cold} cold starts, {warm} warm" if cold or warm else ""  # none: nothing compiled (eager, CPU)
        return f"{self.unit} time {self.total.text()}; {len(self.trials)} launches{starts}"
