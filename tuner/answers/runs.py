"""The answers of the service's own endpoints, declared for its OpenAPI document: its health, a run's progress,
report and plan, the trials in flight, and the schedules and their runs (the study commands' answers are in
`tuner.answers.study`)."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field

from tuner.answers.parts import Answer, CapacityAnswer, JsonObject, Number, ScoreAnswer, SpendAnswer
from tuner.answers.study import StatedContext, StudyStatus
from tuner.storage import TrialState, ValidationMark
from tuner.supervisor import RunState


class Health(Answer):
    """The answer of `GET /healthz`: ok while the service answers."""

    ok: bool


class RunProgress(Answer):
    """How far a run is: trials finished, of its cap."""

    done: int
    of: Optional[int] = Field(description="The run's trial cap; None: as many as fit in its window.")


class TrialSummaryAnswer(Answer):
    """What a study run says about one trial as it ends (`tuner.study.events.TrialSummary`): its number, how it ended,
    whether it ran vLLM's default, its engine settings, its score when it served, its failure class, why it failed,
    was pruned or refused, and for a validation launch its mark."""

    number: int
    state: TrialState = Field(description="Any state but interrupted.")
    baseline: bool
    config: JsonObject
    score: Optional[ScoreAnswer]
    failure_class: Optional[str]
    reason: Optional[str]
    validation: Optional[ValidationMark] = Field(description="None for a search trial.")  # the record itself


class BudgetPlanAnswer(Answer):
    """A run's budget plan (`tuner.study.budget.BudgetPlan`): its slots, budget (seconds of slot time), the search
    trials that fit and their expected length, the validation's launches and whether they fit, and the plan in
    words."""

    unit: str
    slots: int
    budget_s: Number
    trial_s: Number
    launch_s: Number
    trials: int
    validation_launches: int
    validation_fits: bool
    measured: int
    probes: int
    no_candidate: bool = Field(False, description="Nothing but vLLM's default to validate yet: the search may use "
                                                  "the validation's share.")
    validation_s: Optional[Number] = Field(None, description="Clock time kept for the validation; None in plans "
                                                             "stored before it was.")
    paired: bool = Field(False, description="Whether the validation was planned paired on one GPU.")
    text: str


class RunReportAnswer(Answer):
    """What a study run did (`tuner.study.events.RunReport`, what `tuner study run --json` prints): every trial it
    ended, validation launches included, why it stopped before its budget if it did, and its validation's verdict
    (None: not asked for)."""

    trials: list[TrialSummaryAnswer]
    stopped_early: Optional[str]
    validation: Optional[str]
    spent: Optional[SpendAnswer] = Field(None, description="What the run's slots' time went to")
    plan: Optional[BudgetPlanAnswer] = Field(None, description="The budget's plan as the run last said it; None "
                                                               "without a budget or a window")


class TrialInFlight(Answer):
    """A trial a run started and has not ended (`tuner.study.events.TrialStarted`), as the run's events file holds
    it: its number, whether it runs vLLM's default, its engine settings, its slot and when it started."""

    kind: Literal["trial_started"] = Field(description="The event that started it.")
    number: int
    baseline: bool
    config: JsonObject
    slot: int
    at: Number = Field(description="When it started, in seconds since the epoch.")


class RunAnswer(Answer):
    """One run as the service reports it (`tuner.runs.RunRecord`): its state, the trials in flight and those
    finished, and once it has ended what it reported."""

    id: str
    study: str
    trials: Optional[int]
    started_at: Number
    state: RunState = Field(description="running, then finished, failed or stopped.")
    ended_at: Optional[Number]
    exit_code: Optional[int]
    error: Optional[str]
    result: Optional[RunReportAnswer] = Field(description="What `tuner study run --json` printed.")
    in_flight: list[TrialInFlight]
    finished: list[TrialSummaryAnswer] = Field(description="In the order they ended.")
    progress: RunProgress
    plan: Optional[BudgetPlanAnswer] = Field(None, description="The budget's plan as the run last said it; None "
                                                               "without a budget or a window")


class StudyWithRuns(StudyStatus):
    """The study's status, and the runs this service started for it."""

    runs: list[RunAnswer]


class ScheduleTrialAnswer(Answer):
    """A trial recorded during a schedule's run, in brief (`tuner.schedule_runs.ScheduleTrial`): how it ended, its
    failure class, its completed throughput and p95 end-to-end latency when it was scored, whether it met the boundary
    (None: not scored), and why it failed, was pruned or fell outside."""

    number: int
    state: TrialState
    failure_class: Optional[str]
    completed_rps: Optional[Number]
    e2e_p95_s: Optional[Number]
    feasible: Optional[bool]
    reason: Optional[str]


class ScheduleBestAnswer(Answer):
    """A study's recommendation as a schedule's run found it (`tuner.schedule_runs.ScheduleBest`): its trial, completed
    throughput, p95 end-to-end latency and `vllm serve` command, and its validation's verdict ("not validated" when
    none)."""

    trial: int
    completed_rps: Number
    e2e_p95_s: Number
    serve_command: str
    # Absent from summaries written before validations; the schedule answers leave out what was not given.
    validation: Optional[str] = None
    capacity: Optional[CapacityAnswer] = None  # after a load search; absent from older summaries
    # How it breaks the boundary at your traffic, when no configuration tried carries it; absent otherwise.
    violations: Optional[list[str]] = None


# The best as summaries have carried it since its context was added; before that, ScheduleBestAnswer alone.
# Pydantic orders fields from the last base to the first: the best's own keys, then where it was measured.
class ScheduleBestInContext(StatedContext, ScheduleBestAnswer):
    """A study's recommendation as a schedule's run found it, with its boundary, the machine, vLLM and the trace."""


class ScheduleRunAnswer(Answer):
    """One run of a schedule and what it left (`tuner.schedule_runs.ScheduleRun`)."""

    id: int
    schedule: str
    study: str
    state: RunState
    due_at: str
    started_at: str
    window_end: str
    finished_at: Optional[str]
    trials: list[ScheduleTrialAnswer]
    best: Optional[Union[ScheduleBestInContext, ScheduleBestAnswer]] = Field(
        union_mode="left_to_right", description="The study's recommendation when the run ended.")
    previous_best: Optional[Union[ScheduleBestInContext, ScheduleBestAnswer]] = Field(
        union_mode="left_to_right", description="The same when the run began.")
    stopped_early: Optional[str]
    error: Optional[str]
    by_state: dict[str, int]
    failures: dict[str, int]
    new_best: bool


class ScheduleRunWithSummary(ScheduleRunAnswer):
    """A schedule's run with its morning summary in words."""

    summary: list[str] = Field(description="The morning summary, in words.")


class ScheduleAnswer(Answer):
    """A schedule: its name, study, cron, window and trial cap, its next run (None: the cron never fires again) and its
    last run (None before the first)."""

    name: str
    study: str
    cron: str
    window_s: Number
    trials: Optional[int]
    next_run: Optional[str]
    last_run: Optional[ScheduleRunAnswer]


class Removed(Answer):
    """What a DELETE removed: its name."""

    removed: str
