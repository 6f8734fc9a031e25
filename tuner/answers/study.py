"""The study commands' answers, declared for the service's OpenAPI document: each a pydantic model whose JSON is
what `--json` prints and what the service returns, read alike here and by the service's client; built of the
parts in `tuner.answers.parts`."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import Field

from tuner.answers.parts import (Answer, BoundaryAnswer, CapacityAnswer, Empty, GpuTimeAnswer,
                                 HardwareAnswer, JsonObject, LimitingResourceAnswer, MeasurementSummary, ModelAnswer,
                                 Number, ProbeLengthAnswer, RejectionAnswer, ScoreAnswer, SpendAnswer, TraceAnswer,
                                 TraceSelectionAnswer, ValidationAnswer)
from tuner.traces.records import TraceFit


class StudyListing(Answer):
    """One study in the list."""

    name: str
    created_at: str
    boundary: str
    space: str
    trace: str = Field(description="The trace file's name.")
    trials: int
    feasible: int = Field(description="Trials that met the boundary.")


class WarmStartAnswer(Answer):
    """The configurations carried over from an earlier study."""

    from_: str = Field(alias="from")
    trials: list[int]
    configs: list[JsonObject]
    skipped: list[str]


class StudyCreated(Answer):
    """The study's settings as stored, where it is stored, how long its trials will replay, and its warm start when
    one was asked for."""

    name: str
    created_at: str
    model: str
    model_info: ModelAnswer
    trace_path: str
    trace_sha256: str
    trace_selection: TraceSelectionAnswer
    boundary: str
    limits: dict[str, Optional[Number]]
    space_name: str
    space_text: str
    sampler: str
    seed: Optional[int]
    request_timeout_s: Number
    startup_timeout_s: Number
    extra: Empty
    storage: str
    probe_length: ProbeLengthAnswer
    warm_start: Optional[WarmStartAnswer] = Field(None, description="Only when a warm start was asked for.")


class StatedContext(Answer):
    """What every stated recommendation carries: its boundary, the machine (`{}` when the trial recorded none), vLLM
    and the trace."""

    boundary: BoundaryAnswer
    boundary_text: str
    hardware: Union[HardwareAnswer, Empty]
    measured_on: str
    vllm_version: str
    trace: TraceAnswer


class TrialScore(ScoreAnswer):
    """A scored trial in brief: its score as stored (`ScoreAnswer`), its number and its `vllm serve` command."""

    trial: int
    serve_command: str
    capacity: Optional[CapacityAnswer] = None


# Pydantic orders fields from the last base to the first, then the class's own: the score, then where it was
# measured.
class BestSoFar(StatedContext, TrialScore):
    """The recommendation so far, with its score and what holds it back
    (`tuner.analysis.diagnosis.LimitingResource`)."""

    limiting_resource: Optional[LimitingResourceAnswer] = None


class BaselineAnswer(Answer):
    """vLLM's default configuration as the study ran it: its trial, how it ended, its failure class if it
    failed, and its score as stored (empty when unscored). It is what the gain sentence compares with
    (`tuner.study.recommendation.ComparedDefault`)."""

    trial: int
    state: str
    failure_class: Optional[str]
    # Tried in this order: a rejection is not a score, and `{}` is neither.
    score: Union[ScoreAnswer, RejectionAnswer, Empty] = Field(union_mode="left_to_right")
    # What holds it back (`tuner.analysis.diagnosis.LimitingResource`), where the answer says (study status).
    limiting_resource: Optional[LimitingResourceAnswer] = None

    @property
    def scored(self) -> Optional[ScoreAnswer]:
        """Its score when it served and was scored; None when unscored or refused before launch."""
        return self.score if isinstance(self.score, ScoreAnswer) else None

    @property
    def feasible(self) -> bool:
        """Whether its score met the boundary (False when unscored)."""
        return self.scored is not None and self.scored.feasible


class StudyStatus(Answer):
    """Trials by state, the trials in flight and waiting, and the best so far."""

    name: str
    boundary: str
    trials: int
    by_state: dict[str, int]
    running: list[int]
    waiting: list[int]
    best: Optional[BestSoFar]
    baseline: Optional[BaselineAnswer] = None  # vLLM's default configuration, once the study ran it
    # Of `trials`, those that were validation launches (no search trials), and the newest validation's verdict
    # ("not validated" when none was complete).
    validation_launches: int = 0
    validation: str = "not validated"
    spent: Optional[SpendAnswer] = None  # what the study's runs spent so far


class RecommendedConfig(Answer):
    """The configuration a study recommends: the study, the trial, its `vllm serve` command and its engine settings."""

    study: str
    trial: int
    serve_command: str
    engine_config: JsonObject


class OwnPrecisionAnswer(Answer):
    """The best configuration at the model's own precision, shown beside a recommendation that changes numerics:
    its trial, command and settings, its score as stored and its validated gain over vLLM's default in words (or
    why there is none)."""

    trial: int
    serve_command: str
    engine_config: JsonObject
    score: Union[ScoreAnswer, Empty] = Field(union_mode="left_to_right")
    gain: str


class RecommendationAnswer(StatedContext, RecommendedConfig):
    """The recommended configuration: its command, boundary, machine, vLLM, trace, and the validation that states
    its gain over vLLM's default (`baseline` is None when the study did not run the default; `validation` is None
    while the study was not validated, and then no gain is stated)."""

    score: ScoreAnswer
    shortfall: Optional[str] = Field(None, description="How it falls short of your traffic within the boundary; "
                                                       "None when it carries it")
    measurement: MeasurementSummary
    baseline: Optional[BaselineAnswer]
    validation: Optional[ValidationAnswer]
    changes_numerics: bool = Field(False, description="Whether the recommendation computes with other numerics than "
                                                      "the model's own precision (FP8 weights or KV cache)")
    numerics: Optional[str] = Field(None, description="What it changes, in one sentence; None when nothing")
    own_precision: Optional[OwnPrecisionAnswer] = Field(None, description="Beside a recommendation that changes "
                                                                          "numerics: the best configuration at the "
                                                                          "model's own precision")
    spent: Optional[SpendAnswer] = Field(None, description="What finding it out cost")


class Enqueued(Answer):
    """A configuration queued to run next in the study: its engine settings as they will run."""

    study: str
    engine_config: JsonObject


class TrialRowAnswer(Answer):
    """One trial as the report lists it (`tuner.report.content.TrialRow`): its roles, failure class, settings, the
    figures it was judged on (None when it measured nothing), whether it met the boundary (None: not scored), why
    it failed or fell outside, what holds it back, and in a study with a load search its capacity and probes."""

    trial: int
    attempt: int
    roles: list[str]
    state: str
    failure_class: Optional[str]
    config: JsonObject
    settings: JsonObject = Field(description="its configuration less the settings all trials share")
    completed: Optional[int]
    requests: Optional[int]
    completed_rps: Optional[Number]
    ttft_p95_s: Optional[Number]
    e2e_p95_s: Optional[Number]
    queue_s_mean: Optional[Number]
    inference_s_mean: Optional[Number]
    preemptions: Optional[int]
    kv_tokens: Optional[int]
    feasible: Optional[bool]
    why: str
    capacity: Optional[CapacityAnswer] = Field(None, description="Only in a study with a load search.")
    probes: Optional[list[JsonObject]] = Field(None, description="Only in a study with a load search: each probe "
                                                                 "with its verdict and reasons.")
    limiting_resource: Optional[LimitingResourceAnswer]
    trace_fit: Optional[TraceFit] = Field(None, description="How many of the trace's requests its max_model_len "
                                                            "clipped or scaled; None: replayed as recorded.")
    gpu_time: Optional[GpuTimeAnswer] = Field(None, description="Its own slot time by part; idle is the runs'")


class MachineAnswer(Answer):
    """One machine and vLLM version a study measured on, and the trials measured there
    (`tuner.report.content.MachineGroup`)."""

    hardware: str
    vllm_version: str
    trials: list[int]


class SideBySideAnswer(Answer):
    """One line of the default-beside-recommendation table, every cell as printed."""

    what: str
    default: str
    recommended: str
    change: str


class ReportSummary(Answer):
    """The report's content (`tuner.report.content.summary`): the study, its boundary, trace and machines, the
    recommendation (None: none yet) in data and in sentences, the default beside it, and every trial."""

    study: str
    generated_at: str
    model: str
    boundary: BoundaryAnswer
    boundary_text: str
    trace: TraceAnswer
    measured_on: list[MachineAnswer]
    recommendation: Optional[RecommendationAnswer]
    recommendation_text: list[str]
    default_trial: Optional[int]
    side_by_side: list[SideBySideAnswer]
    common_settings: JsonObject
    trials: list[TrialRowAnswer]
    pareto: list[int]
    timelines: list[int]
    spent: Optional[SpendAnswer] = None


class ReportAnswer(Answer):
    """The report's text parts and its summary (what `tuner study report --json` prints)."""

    summary: ReportSummary
    recommended: bool
    lines: list[str]
    side_by_side: list[list[str]]
    baseline_trial: Optional[int]
    recommended_trial: Optional[int]
    common_settings: JsonObject
    trial_rows: list[TrialRowAnswer]
