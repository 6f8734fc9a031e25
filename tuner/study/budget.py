"""A run's budget: the slots' time it may spend (`tuner study run --budget 20m`: GPU time summed over slots) or the
clock time it may take (`--window`, a schedule's window), and the plan that fits an answer into it.

The search gets what the validation does not need: once a configuration other than vLLM's default is a candidate,
before each trial the run checks that the trial, at the median time of the study's trials of its kind, ends before
the validation's share begins (until then a validation could not run, and the search may use its share); the
validation's launches (at the median time of a validation launch) are kept time for at the end. Where the budget
cannot hold the validation, the search has it all and the answer says that it was not validated, and why.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from tuner.common.durations import format_duration


def launches_s(launches: int, slots: int, launch_s: float) -> float:
    """The clock time `launches` of `launch_s` each take on this many slots, a round of launches at a time."""
    return math.ceil(launches / max(1, slots)) * launch_s


@dataclass(frozen=True)
class LaunchCost:
    """What a validation launch is expected to take: its engine's startup, then its probes (draining included)."""

    startup_s: float
    probing_s: float
    probes: float = 0.0  # how many probes that is
    # Paired only: one engine's sleep, after its launch and after every other probe (workers/paired.py); 0 where
    # the timings it was judged by hold their sleeps already.
    sleep_s: float = 0.0

    @property
    def total_s(self) -> float:
        """The whole launch."""
        return self.startup_s + self.probing_s

    def validation_s(self, launches: int, slots: int, paired_arms: int = 0, held: bool = False) -> float:
        """The clock time of `launches` validation launches on this many slots, a round of launches at a time; or,
        paired on one GPU (`paired_arms` engines), one startup and sleep per arm (none where the engines are `held`
        from the search's opening pair) and then the launches' probes, a sleep every other probe (the steps alternate
        the arms' order, `tuner.workers.paired`)."""
        if paired_arms:
            return (0 if held else paired_arms * (self.startup_s + self.sleep_s)) + \
                launches * (self.probing_s + self.probes * self.sleep_s / 2)
        return launches_s(launches, slots, self.total_s)


@dataclass(frozen=True)
class RunBudget:
    """What one run may spend: slot time summed over slots, clock time, or both; and the validation launches it
    keeps time for (0: no validation)."""

    started_at: float  # time.time()
    budget_s: float | None = None  # slot time, summed over slots
    window_end: float | None = None  # time.time() by which the run ends
    validation_launches: int = 0
    validation_arms: int = 0  # the configurations those launches run (vLLM's default among them)
    pairing: bool = True  # whether the validation may run paired where the platform allows (`--pairing`)

    def end(self, slots: int) -> float | None:
        """When the run must have ended (time.time()), on this many slots; None without a limit."""
        ends = [self.window_end] if self.window_end is not None else []
        if self.budget_s is not None:
            ends.append(self.started_at + self.budget_s / max(1, slots))
        return min(ends, default=None)

    def search_end(self, slots: int, validation_s: float) -> float | None:
        """When the search's last trial must have ended, so that the validation (`validation_s` of clock time) fits
        before the end; the end itself where the validation cannot fit from the start (the search then has it all)."""
        end = self.end(slots)
        if end is None:
            return None
        kept = end - validation_s
        return kept if kept > self.started_at else end


@dataclass(frozen=True)
class BudgetPlan:
    """The plan a run made of its budget when its slots were up: trials of about `trial_s` each until the validation
    must begin, then `validation_launches` of about `launch_s` each; `measured` trials behind the estimates (0: none
    yet, and the run plans again once its first trial has ended)."""

    unit: str  # "GPU" or "CPU slot"
    slots: int
    budget_s: float  # slot time, summed over slots
    trial_s: float
    launch_s: float
    trials: int  # search trials that fit before the validation's share
    validation_launches: int
    validation_fits: bool
    measured: int
    probes: int = 1  # a search trial's probes at most (`LoadPolicy.probe_budget`); a validation launch's, twice that
    no_candidate: bool = False  # nothing but vLLM's default to validate yet: the search may use the validation's share
    # The clock time kept for the validation, paired (one engine started per arm) or not; None in plans stored
    # before it was: then the launches' rounds at `launch_s` each.
    validation_s: float | None = None
    paired: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Every field, and the plan in words (`text`)."""
        return {**asdict(self), "text": self.text()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BudgetPlan:
        """The plan `to_dict` gave (its text is made again, not read)."""
        return cls(**{k: v for k, v in data.items() if k != "text"})

    def text(self) -> str:
        """`budget 20m of GPU time on 1 GPU: about 4 search trials of 2m30s, then 4 validation launches of 3m05s
        (12m20s kept for them); estimated from 6 trials`."""
        slots = f"{self.slots} {self.unit}" + ("s" if self.slots != 1 else "")
        head = f"budget {format_duration(self.budget_s)} of {self.unit} time on {slots}: "
        if not self.measured:  # the trace's span says nothing of startup: no figure is better than a wrong one
            keep = (f"{self.validation_launches} validation launches to keep time for" if self.validation_launches
                    else "no validation")
            return f"{head}{keep}; no trial measured yet, so the trials are planned once the first has ended"
        each = f" (at most {self.probes} probes each)" if self.probes > 1 else ""
        search = f"about {self.trials} search trials of {format_duration(self.trial_s)}{each}"
        if not self.validation_launches:
            plan = search
        elif self.validation_fits:
            kept = (self.validation_s if self.validation_s is not None
                    else launches_s(self.validation_launches, self.slots, self.launch_s)) * self.slots
            how = "paired on one GPU, " if self.paired else ""
            plan = (f"{search}, then {self.validation_launches} validation launches of "
                    f"{format_duration(self.launch_s)} ({how}{format_duration(kept)} kept for them)")
        else:
            plan = (f"{search}; {self.validation_launches} validation launches of {format_duration(self.launch_s)} "
                    f"do not fit, so the answer will not be validated")
        if self.no_candidate and self.validation_fits and self.validation_launches:
            plan += ("; while vLLM's default is the only candidate, the search goes on into the validation's share "
                     "(a validation needs another configuration to launch)")
        return f"{head}{plan}; estimated from {self.measured} trials"
