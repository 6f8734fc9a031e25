"""What a study run reports: one record per trial it ends, the run's report, and the events it sends its caller
as it goes (`StudyRunner(on_event=...)`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from tuner.analysis.scoring import Score
from tuner.storage import TrialState, ValidationMark
from tuner.storage.spend import Spend
from tuner.study.budget import BudgetPlan
from tuner.workers.engine_config import EngineConfig

if TYPE_CHECKING:  # the pool imports Ray: only the runner, which makes one, loads it
    from tuner.workers.pool import WorkerPool

# Why a run stopped before its budget (RunReport.stopped_early), besides a stop asked from outside.
WINDOW_END = "stopped at the window's end"
NO_TIME_LEFT = "no time left in the window for another trial"
BUDGET_SPENT = "no time left in the budget for another trial"
BUDGET_END = "stopped at the budget's end"
BUDGET_KEPT = "no time left for another search trial: the rest of the budget is kept for the validation"
# How often a run with trials in flight, or a paired job, looks at the clock and for a stop request.
STOP_POLL_S = 1.0


@dataclass(frozen=True)
class TrialSummary:
    """What a study run says about one trial as it ends (for progress lines and tests)."""

    number: int
    state: TrialState  # any but interrupted
    baseline: bool
    config: EngineConfig
    score: Score | None = None
    failure_class: str | None = None
    reason: str | None = None  # failure message, prune reason or infeasibility
    validation: ValidationMark | None = None  # a validation launch's mark; None for a search trial

    def to_dict(self) -> dict:
        """JSON-ready: what `tuner study run --json` and the run's events file hold for the trial."""
        return {"number": self.number, "state": self.state.value, "baseline": self.baseline,
                "config": self.config.to_dict(), "score": self.score.to_dict() if self.score else None,
                "failure_class": self.failure_class, "reason": self.reason,
                "validation": self.validation.to_dict() if self.validation else None}

    @classmethod
    def from_dict(cls, data: dict) -> TrialSummary:
        """The summary `to_dict` gave (as the service sends a run's progress)."""
        mark = data.get("validation")
        return cls(data["number"], TrialState(data["state"]), data["baseline"], EngineConfig.from_dict(data["config"]),
                   Score.from_dict(data["score"]) if data["score"] else None, data["failure_class"], data["reason"],
                   ValidationMark.from_dict(mark) if mark else None)


@dataclass
class RunReport:
    """What a run did: every trial it ended (validation launches included), why it stopped before its budget if it
    did, and its validation's verdict (`Validation.sentence`) or why none was given (None: not asked for)."""

    trials: list[TrialSummary] = field(default_factory=list)
    stopped_early: str | None = None  # why fewer trials ran than asked
    validation: str | None = None
    spent: Spend | None = None  # what the run's slots' time went to; None when no slot was held
    plan: BudgetPlan | None = None  # the budget's plan as the run last said it; None without a budget

    def to_dict(self) -> dict:
        """JSON-ready: what `tuner study run --json` prints."""
        return {"trials": [t.to_dict() for t in self.trials], "stopped_early": self.stopped_early,
                "validation": self.validation, "spent": self.spent.to_dict() if self.spent else None,
                "plan": self.plan.to_dict() if self.plan else None}

    @classmethod
    def from_dict(cls, data: dict) -> RunReport:
        """The report `to_dict` gave (as a run on the service hands it back)."""
        spent, plan = data.get("spent"), data.get("plan")
        return cls([TrialSummary.from_dict(t) for t in data["trials"]], data["stopped_early"], data.get("validation"),
                   Spend.from_dict(spent) if spent else None, BudgetPlan.from_dict(plan) if plan else None)


# The events, one record per kind.


@dataclass(frozen=True)
class PoolReady:
    """The workers are up; no trial is in flight yet."""

    slots: int
    pool: WorkerPool


@dataclass(frozen=True)
class BudgetPlanned:
    """A run under a budget planned its search and validation, its slots up (and again once its first trial
    ended)."""

    KIND: ClassVar[str] = "budget_planned"  # its `kind` in the run's events file
    plan: BudgetPlan

    def to_dict(self) -> dict:
        """JSON-ready, as the run's events file holds it."""
        return {"plan": self.plan.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> BudgetPlanned:
        """The event `to_dict` gave (other keys, such as the events file's `kind`, are left out)."""
        return cls(BudgetPlan.from_dict(data["plan"]))


@dataclass(frozen=True)
class TrialStarted:
    """A trial was asked of Optuna and is about to be checked and launched on a slot."""

    KIND: ClassVar[str] = "trial_started"  # its `kind` in the run's events file
    number: int
    baseline: bool
    config: EngineConfig
    slot: int
    at: float  # time.time()

    def to_dict(self) -> dict:
        """JSON-ready, as the run's events file holds it."""
        return {"number": self.number, "baseline": self.baseline, "config": self.config.to_dict(),
                "slot": self.slot, "at": self.at}

    @classmethod
    def from_dict(cls, data: dict) -> TrialStarted:
        """The event `to_dict` gave (other keys, such as the events file's `kind`, are left out)."""
        return cls(data["number"], data["baseline"], EngineConfig.from_dict(data["config"]), data["slot"], data["at"])


@dataclass(frozen=True)
class WorkerDone:
    """A worker handed back a trial's result (before it is scored and stored)."""

    number: int
    slot: int
    node: str
    scheduling_s: float | None  # from the slot freeing to this trial's engine launch; None for a slot's first


@dataclass(frozen=True)
class TrialDone:
    """A trial ended and was stored, whatever its state."""

    KIND: ClassVar[str] = "trial_done"  # its `kind` in the run's events file
    summary: TrialSummary

    def to_dict(self) -> dict:
        """JSON-ready, as the run's events file holds it."""
        return {"summary": self.summary.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> TrialDone:
        """The event `to_dict` gave (other keys, such as the events file's `kind`, are left out)."""
        return cls(TrialSummary.from_dict(data["summary"]))


RunEvent = PoolReady | BudgetPlanned | TrialStarted | WorkerDone | TrialDone  # what `on_event` is given


# The run's events file (`tuner study run --events`): one JSON line per trial started or done and per budget plan,
# read by whoever follows the run (the service's runs).
LoggedEvent = TrialStarted | TrialDone | BudgetPlanned
_LOGGED: dict[str, type[TrialStarted] | type[TrialDone] | type[BudgetPlanned]] = {
    kind.KIND: kind for kind in (TrialStarted, TrialDone, BudgetPlanned)}


def logged_dict(event: LoggedEvent) -> dict:
    """The event as its line of the events file holds it: its `to_dict` with its `kind`."""
    return {"kind": event.KIND, **event.to_dict()}


def event_line(event: LoggedEvent) -> str:
    """The event as one line of the events file, newline included."""
    return json.dumps(logged_dict(event)) + "\n"


def read_event_line(line: str) -> LoggedEvent | None:
    """The event one line of the events file holds; None for a line not whole yet (the one being written)."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    return _LOGGED[data["kind"]].from_dict(data)
