"""A schedule's run and what it left, its morning summary: the trials it recorded, the study's recommendation
when it began and when it ended, and why it stopped early or could not go on. Its row is a StoredScheduleRun, the
summary JSON in it as `ScheduleRun.summary` writes it."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from tuner.describe import RecommendationContext, throughput_line
from tuner.analysis.scoring import Capacity
from tuner.storage import StoredScheduleRun, StoredTrial, StudySettings, TrialState
from tuner.study.recommendation import Recommendation, shortfall_sentence
from tuner.supervisor import RunState


@dataclass(frozen=True)
class ScheduleTrial:
    """A trial recorded during a schedule's run, in brief, as its morning summary keeps it."""

    number: int
    state: TrialState
    failure_class: str | None
    completed_rps: float | None  # None: not scored
    e2e_p95_s: float | None
    feasible: bool | None  # whether it met the boundary; None: not scored
    reason: str | None  # why it failed, was pruned or fell outside

    @classmethod
    def of(cls, t: StoredTrial) -> ScheduleTrial:
        """The stored trial in brief."""
        reason = t.failure_message or t.prune_reason or "; ".join(t.score.violations if t.score else []) or None
        return cls(t.trial_number, t.state, t.failure_class, t.scored.completed_rps if t.scored else None,
                   t.scored.e2e_p95_s if t.scored else None, t.score.feasible if t.score else None, reason)

    def to_dict(self) -> dict:
        """As the morning summary stores it."""
        return {**asdict(self), "state": self.state.value}

    @classmethod
    def from_dict(cls, data: dict) -> ScheduleTrial:
        """The trial `to_dict` gave."""
        return cls(**{**data, "state": TrialState(data["state"])})


# The best's own keys in a stored morning summary; the rest are its context's.
_BEST_KEYS = ("trial", "completed_rps", "e2e_p95_s", "serve_command", "validation", "capacity", "violations",
              "others_carry")


@dataclass(frozen=True)
class ScheduleBest:
    """A study's recommendation as a schedule's run found it: its trial, completed throughput, p95 end-to-end latency
    and `vllm serve` command, its validation's verdict, where it was measured (the boundary, the machine, vLLM
    and the trace), and after a load search its capacity. Summaries written before
    verdicts, contexts or capacities were kept have None."""

    trial: int
    completed_rps: float
    e2e_p95_s: float
    serve_command: str
    validation: str | None = None  # the verdict, or "not validated"
    context: RecommendationContext | None = None
    capacity: Capacity | None = None  # None: the study measures at a fixed load
    # How it breaks the boundary at your traffic: a best that carries only part of it (see `shortfall_sentence`)
    violations: tuple[str, ...] = ()
    others_carry: bool = False  # some other configuration tried carried it, yet validation kept the default

    @classmethod
    def of(cls, rec: Recommendation, settings: StudySettings) -> ScheduleBest:
        """The study's recommendation, as a run's summary keeps it."""
        score = rec.trial.scored
        return cls(rec.trial.trial_number, score.completed_rps, score.e2e_p95_s, rec.trial.serve_command,
                   rec.validation.sentence() if rec.validation else "not validated",
                   RecommendationContext.of(rec, settings), score.capacity, tuple(score.violations), rec.others_carry)

    def to_dict(self) -> dict:
        """As the morning summary stores it: the context's keys beside the best's own; what it lacks left out."""
        own = {"trial": self.trial, "completed_rps": self.completed_rps, "e2e_p95_s": self.e2e_p95_s,
               "serve_command": self.serve_command}
        if self.validation is not None:
            own["validation"] = self.validation
        if self.capacity is not None:
            own["capacity"] = self.capacity.to_dict()
        if self.violations:
            own["violations"] = list(self.violations)
        if self.others_carry:
            own["others_carry"] = True
        return {**own, **(self.context.to_dict() if self.context else {})}

    @classmethod
    def from_dict(cls, data: dict) -> ScheduleBest:
        """The best `to_dict` gave."""
        context = {key: value for key, value in data.items() if key not in _BEST_KEYS}
        return cls(data["trial"], data["completed_rps"], data["e2e_p95_s"], data["serve_command"],
                   data.get("validation"), RecommendationContext.from_dict(context) if context else None,
                   Capacity.from_dict(data["capacity"]) if data.get("capacity") else None,
                   tuple(data.get("violations") or ()), bool(data.get("others_carry")))

    def line(self) -> str:
        """Its trial, throughput (after a load search, its capacity) and latency in words."""
        capacity_rps = self.capacity.rps if self.capacity else None
        carried = throughput_line(self.completed_rps, self.e2e_p95_s, capacity_rps, searched=self.capacity is not None)
        shortfall = f"; {shortfall_sentence(list(self.violations), self.others_carry)}" if self.violations else ""
        return f"trial {self.trial}: {carried}{shortfall}"


@dataclass(frozen=True)
class ScheduleRun:
    """One run of a schedule and what it left: the morning summary."""

    id: int
    schedule: str
    study: str
    state: RunState
    due_at: str  # ISO 8601 with the host's offset
    started_at: str
    window_end: str
    finished_at: str | None
    trials: list[ScheduleTrial]  # each trial recorded during the run
    best: ScheduleBest | None  # the study's recommendation when the run ended
    previous_best: ScheduleBest | None  # the same when the run began
    stopped_early: str | None  # why the run ended before its trial cap (the window, a stop)
    error: str | None  # why the run could not go on, when it could not

    @property
    def by_state(self) -> dict[str, int]:
        """Its trials counted by state."""
        return dict(Counter(t.state.value for t in self.trials))

    @property
    def failures(self) -> dict[str, int]:
        """Its failed trials counted by failure class."""
        return dict(Counter(t.failure_class for t in self.trials if t.failure_class))

    @property
    def new_best(self) -> bool:
        """Whether the run left a best trial other than the one before it (True for a first best)."""
        return self.best is not None and (self.previous_best is None or self.best.trial != self.previous_best.trial)

    def lines(self) -> list[str]:
        """The morning summary in words: what ran, what failed, the best so far and whether it is new."""
        lines = [f"{self.schedule} (study {self.study}): {self.state}, started {self.started_at}, "
                 f"window until {self.window_end}" + (f", ended {self.finished_at}" if self.finished_at else "")]
        if self.state is RunState.RUNNING:
            return lines
        counts = ", ".join(f"{n} {state}" for state, n in sorted(self.by_state.items()))
        lines.append(f"{len(self.trials)} trial{'' if len(self.trials) == 1 else 's'}"
                     + (f": {counts}" if counts else ""))
        if self.failures:
            lines.append("failures: " + ", ".join(f"{cls} x{n}" for cls, n in sorted(self.failures.items())))
        if self.best is None:
            lines.append("no configuration has met the boundary yet")
        elif self.new_best:
            was = f" (was {self.previous_best.line()})" if self.previous_best else " (the first)"
            lines.append(f"new best: {self.best.line()}{was}")
        else:
            lines.append(f"best unchanged: {self.best.line()}")
        if self.best is not None and self.best.context is not None:
            lines.append(f"  {self.best.context.line(meets=not self.best.violations)}")
        if self.best is not None:  # a gain only with its interval: the validation's verdict, or "not validated"
            lines.append(f"  {self.best.validation if self.best.validation is not None else 'not validated'}")
        if self.stopped_early:
            lines.append(f"stopped early: {self.stopped_early}")
        if self.error:
            lines.append(f"error: {self.error}")
        return lines

    @staticmethod
    def summary(trials: list[ScheduleTrial], best: ScheduleBest | None, previous_best: ScheduleBest | None,
                stopped_early: str | None = None, error: str | None = None) -> dict[str, Any]:
        """The morning summary as a run's row keeps it (`of` reads it back)."""
        return {"trials": [t.to_dict() for t in trials], "best": best.to_dict() if best else None,
                "previous_best": previous_best.to_dict() if previous_best else None, "stopped_early": stopped_early,
                "error": error}

    @classmethod
    def of(cls, stored: StoredScheduleRun) -> ScheduleRun:
        """The stored run, its summary as written then (older ones lack some keys)."""
        summary = stored.summary
        best, previous_best = summary.get("best"), summary.get("previous_best")
        assert stored.id is not None  # read back from the repository, so stored
        return cls(stored.id, stored.schedule, stored.study, RunState(stored.state), stored.due_at,
                   stored.started_at, stored.window_end, stored.finished_at,
                   [ScheduleTrial.from_dict(t) for t in summary.get("trials", [])],
                   ScheduleBest.from_dict(best) if best else None,
                   ScheduleBest.from_dict(previous_best) if previous_best else None, summary.get("stopped_early"),
                   summary.get("error"))

    def to_dict(self) -> dict:
        """The run as JSON-ready data: every field, the trials and the bests as the summary stores them, with
        `by_state`, `failures` and `new_best`."""
        return {"id": self.id, "schedule": self.schedule, "study": self.study, "state": self.state.value,
                "due_at": self.due_at, "started_at": self.started_at, "window_end": self.window_end,
                "finished_at": self.finished_at,
                **self.summary(self.trials, self.best, self.previous_best, self.stopped_early, self.error),
                "by_state": self.by_state, "failures": self.failures, "new_best": self.new_best}
