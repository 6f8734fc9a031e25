"""What each study command answers, as JSON-ready data: the same answers whether the command line runs them
here (`LocalStudies`) or asks a tuner service for them (`tuner.service_client.RemoteStudies`), so both print
alike. The service itself answers with `LocalStudies`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, Protocol, Union

from optuna.trial import TrialState
from pydantic import BaseModel, ConfigDict, Field

from tuner.capacity import LoadPolicy
from tuner.describe import RecommendationContext, baseline_dict, recommendation_dict
from tuner.errors import TunerError
from tuner.kv_budget import ModelMemory
from tuner.models import default_model
from tuner.paths import bundled_trace
from tuner.scoring import boundary, parse_limits
from tuner.storage import StoredTrial
from tuner.storage.spend import GpuTime, Spend
from tuner.storage.urls import redact_url
from tuner.study.capacity_plan import CAPACITY_PLAN_ATTR, plan_capacity
from tuner.study.plan import load_optuna_study
from tuner.study.recommendation import find_baseline, recommend, trial_limit
from tuner.traces.records import TraceFit
from tuner.traces.selection import TraceSelection
from tuner.workers.engine_config import EngineConfig

if TYPE_CHECKING:
    from tuner.storage import ValidationMark
    from tuner.study.capacity_plan import PlanOptions


class NoRecommendation(TunerError):
    """No trial of the study met its boundary yet (the command exits 1: an answer, not bad usage)."""


class StudyRequest(BaseModel):
    """A study to create: the options of `tuner study create`. Paths are read where the study is created."""

    # Declared once: `tuner study create` fills it from its parameters of the same names, the service takes it as
    # its request body, and its client sends it.
    name: str = Field(min_length=1, max_length=200)
    model: Optional[str] = None
    trace: Optional[str] = None
    trace_latest: Optional[str] = Field(None, description="A folder of traces: its newest file is replayed, and the "
                                                          "study warm-starts from the latest one like it.")
    warm_from: Optional[str] = Field(None, description="An earlier study whose best configurations run first.")
    space: str = "cpu-small"
    boundary: str = "interactive"
    limits: list[str] = []
    window: Optional[str] = None
    rate_scale: Optional[float] = None
    max_requests: Optional[int] = None
    fit: Optional[str] = None
    spread: bool = Field(False, description="Spread the requests that share one recorded arrival up to the next.")
    sampler: str = "bottleneck"  # tuner.samplers.DEFAULT_SAMPLER; that module imports Optuna, this one stays light
    seed: Optional[int] = None
    request_timeout_s: float = 600.0
    startup_timeout_s: float = 600.0
    load: str = Field("search", description="search (the capacity, by load probes) or fixed (one replay at the "
                                            "reference load).")
    precision: Optional[float] = Field(None, description="The load search's precision; default 0.1 (0.25 for the "
                                                         "bundled demo trace).")
    probe_budget: int = 6
    load_range: Optional[str] = Field(None, description="MIN:MAX multiples of the reference load.")
    probe_requests: int = 80
    probe_seconds: Optional[float] = Field(None, description="Least seconds of arrivals a probe; default 20 (10 for "
                                                             "the bundled demo trace).")
    allow_fp8: bool = Field(False, description="Search FP8 weights and KV cache too: they change the model's "
                                               "numerics.")


# The answers' shapes, declared for the service's OpenAPI document. An answer may carry more than is declared
# (extra="allow"); numbers are kept as given (an int stays an int in the JSON).
Number = float | int
JsonObject = dict[str, Any]
# `{}`: a record that is not there (no hardware recorded, a baseline never scored), as the answers have always
# written it.
Empty = Annotated[JsonObject, Field(max_length=0)]


class Answer(BaseModel):
    """An answer of a study command or of the service: declared fields for the OpenAPI document, undeclared keys kept
    (extra="allow"), and `to_dict` gives back exactly the keys it was given."""

    model_config = ConfigDict(extra="allow")

    def to_dict(self) -> dict:
        """The answer as JSON-ready data, exactly the keys it was given (what `--json` prints)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


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


class TraceSelectionAnswer(Answer):
    """Which part of a trace is replayed and how it is reshaped (`tuner.traces.selection.TraceSelection`); None where
    it is not."""

    window_s: Optional[tuple[Number, Number]] = Field(description="[start, end) in seconds from the first request")
    max_requests: Optional[int]
    rate_scale: Optional[Number]
    fit: Optional[str] = Field(description="clip or scale to max_model_len")
    spread: bool = Field(False, description="requests sharing one recorded arrival spread up to the next one")


class ModelAnswer(Answer):
    """What a study stored about its model (`tuner.storage.StudyModel`); `memory` only when its sizes were stored."""

    architecture: str
    vocab_size: int
    max_position_embeddings: int
    kv_bytes_per_token: int
    memory: Optional[ModelMemory] = None  # the dataclass itself: pydantic validates and describes it


class ProbeLengthAnswer(Answer):
    """How long the study's trials will replay (`tuner.capacity.ProbeLength`): its probe at the reference load (the
    requests, their offered req/s and how long their arrivals last), how long any other probe's arrivals last at
    least, a trial's probes at most, and the least a trial that runs them all replays for."""

    requests: int
    offered_rps: Number
    arrival_s: Number
    least_arrival_s: Number
    probes: int
    trial_arrival_s: Number


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


class TraceAnswer(Answer):
    """The trace a recommendation was measured on: its path, the sha256 of its bytes, and the selection replayed."""

    path: str
    sha256: str
    selection: TraceSelectionAnswer


class BoundaryAnswer(Answer):
    """The limits a recommendation meets (`tuner.scoring.Boundary`); None where the boundary sets no limit."""

    name: str
    ttft_p95_s: Optional[Number]
    e2e_p95_s: Optional[Number]
    min_completion_ratio: Number
    makespan_factor: Optional[Number]
    makespan_grace_s: Number
    tpot_p95_s: Optional[Number]
    ttft_per_1k_prompt_p95_s: Optional[Number] = Field(None, description="p95 TTFT per 1,000 prompt tokens (a prompt "
                                                                         "under 1,000 counts as 1,000)")


class HardwareAnswer(Answer):
    """The machine a trial ran on (`tuner.hardware.HardwareInfo`); the GPU fields describe the first GPU."""

    accelerator: str = Field(description="cuda or cpu")
    gpu_model: Optional[str]
    gpu_memory_gib: Optional[Number]
    gpu_count: int
    cpu_model: str
    cpu_cores: int
    memory_gib: Number


class StatedContext(Answer):
    """What every stated recommendation carries: its boundary, the machine (`{}` when the trial recorded none), vLLM
    and the trace."""

    boundary: BoundaryAnswer
    boundary_text: str
    hardware: Union[HardwareAnswer, Empty]
    measured_on: str
    vllm_version: str
    trace: TraceAnswer


class PercentilesAnswer(Answer):
    """p50, p95 and p99 of a figure over a replay's requests (None where no request gave it)."""

    p50: Optional[Number]
    p95: Optional[Number]
    p99: Optional[Number]


class MeasurementSummary(Answer):
    """What a recommendation's replay at the reference load measured, in brief: requests completed of those sent,
    completed req/s and output tok/s, TTFT and end-to-end percentiles, vLLM's p95 queue time, preemptions, and (since
    load probes) the offered load."""

    completed: int
    requests: int
    completed_rps: Number
    output_tps: Number
    ttft_s: PercentilesAnswer
    e2e_s: PercentilesAnswer
    queue_s_p95: Optional[Number]
    preemptions: int
    offered_rps: Optional[Number] = None


class CapacityAnswer(Answer):
    """What a load search found: the highest passing offered load (req/s; None when no probe passed), that load
    against the reference load and the trace's recorded rate, the lowest load above it that did not pass, the
    probes run, and why the search ended (`tuner.scoring.Capacity`)."""

    rps: Optional[Number]
    factor: Optional[Number]
    rate_scale: Optional[Number]
    edge_rps: Optional[Number]
    probes: int
    ended: str


class ScoreAnswer(Answer):
    """A trial's score as stored (`tuner.scoring.Score`): completed throughput, p95 end-to-end latency, output rate
    and completion ratio, each limit's distance (<= 0 when met) and the violations, its capacity after a load
    search, and whether it met the boundary."""

    completed_rps: Number
    e2e_p95_s: Number
    output_tps: Number
    completion_ratio: Number
    constraints: dict[str, Number]
    violations: list[str]
    capacity: Optional[CapacityAnswer]
    whole_share: Number = Field(1.0, description="The share of the trace's requests served as asked (the rest were "
                                                 "clipped to max_model_len, which vLLM would refuse); the traffic "
                                                 "carried whole is the capacity times it.")
    feasible: bool


class TrialScore(ScoreAnswer):
    """A scored trial in brief: its score as stored (`ScoreAnswer`), its number and its `vllm serve` command."""

    trial: int
    serve_command: str
    capacity: Optional[CapacityAnswer] = None


class RejectionAnswer(Answer):
    """A proposal the search space's rules refused before launch (`tuner.scoring.Rejection`): never feasible."""

    feasible: bool
    violations: list[str]


class LimitingResourceAnswer(Answer):
    """What holds a configuration back at the load where it stops meeting its boundary
    (`tuner.diagnosis.LimitingResource`): the kind of limit, that load, the figures behind it and a sentence."""

    kind: str
    at_rps: Optional[Number]
    evidence: JsonObject
    sentence: str


# Pydantic orders fields from the last base to the first, then the class's own: the score, then where it was
# measured.
class BestSoFar(StatedContext, TrialScore):
    """The recommendation so far, with its score and what holds it back (`tuner.diagnosis.LimitingResource`)."""

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
    # What holds it back (`tuner.diagnosis.LimitingResource`), where the answer says (study status).
    limiting_resource: Optional[LimitingResourceAnswer] = None

    @property
    def scored(self) -> Optional[ScoreAnswer]:
        """Its score when it served and was scored; None when unscored or refused before launch."""
        return self.score if isinstance(self.score, ScoreAnswer) else None

    @property
    def feasible(self) -> bool:
        """Whether its score met the boundary (False when unscored)."""
        return self.scored is not None and self.scored.feasible


class GpuTimeAnswer(Answer):
    """Slot time by what it went to (`tuner.storage.spend.GpuTime`), in seconds."""

    startup_s: Number = Field(description="Engines starting and stopping")
    probes_s: Number = Field(description="Requests arriving at the probes' loads")
    draining_s: Number = Field(description="The rest of the replays: tails after the last arrival, waits for an idle "
                                           "engine, warm-ups")
    idle_s: Number = Field(description="Held by a run, running no trial")
    total_s: Number


class TrialSpendAnswer(GpuTimeAnswer):
    """One launched trial's time, its compile cache (cold: compiled at startup) and whether it validated."""

    trial: int
    compile_cache: str
    validation: bool


class SpendAnswer(Answer):
    """What the study's answer cost (`tuner.storage.spend.Spend`): GPU time where its slots were GPUs, by part, per
    trial and in total, with cold and warm starts."""

    unit: str = Field(description="GPU, or CPU slot")
    total: GpuTimeAnswer
    cold_starts: int
    warm_starts: int
    runs: int = Field(description="Runs kept; the idle time of runs before they were kept is unknown")
    trials: list[TrialSpendAnswer]
    idle_s: Number
    text: str


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


class GainAnswer(Answer):
    """A validated gain (`tuner.validation.GainInterval`): the ratio of carried loads, its 95% interval (the high
    end None where unbounded), the repeats behind each side (the compared configuration's, the default's), whether
    they were paired rounds, and the confidence level."""

    ratio: Number
    low: Number
    high: Optional[Number]  # None: no failing load bounded the compared configuration's capacity above
    repeats: list[int]
    paired: bool = False  # the interval is the paired one on the rounds' log ratios
    confidence: Number


class ValidationArmAnswer(Answer):
    """One configuration in a validation: its label, the search trial it repeats (None: vLLM's default), its
    launches' trial numbers, what each carried, the median, and the failure class of each launch that failed."""

    label: str
    of_trial: Optional[int]
    trials: list[int]
    values: list[Number]
    median: Optional[Number]
    failures: list[str] = Field(default_factory=list)


class ValidationAnswer(Answer):
    """A validation (`tuner.validation.Validation`): its arms in launch order, the trials in the order they ran,
    the finalist's gain over vLLM's default with its interval, whether the default stays, and the verdict."""

    run: int
    repeats: int
    unit: str
    complete: bool
    against_itself: bool
    paired: bool = False  # its launches were paired rounds on one GPU (vLLM's sleep mode)
    arms: list[ValidationArmAnswer]
    order: list[int]
    gain: Optional[GainAnswer]
    keep_default: bool
    recommended: str
    sentence: str


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


class MeasuredCapacityAnswer(Answer):
    """A configuration's capacity within the boundary (`tuner.replicas.MeasuredCapacity`), req/s: the central value,
    its 95% interval (the high end None where unbounded) and the launches behind it (1: measured once)."""

    rps: Number
    low: Number
    high: Optional[Number]
    launches: int
    measured_once: bool


class ReplicaCountAnswer(Answer):
    """Replicas that carry a rate (`tuner.replicas.ReplicaCount`): at the capacity's high end and at its low end."""

    low: int
    high: int


class DayPlanAnswer(Answer):
    """One configuration over a day (`tuner.replicas.DayPlan`): replicas per hour, and [low, high] of its slot-hours,
    its cost per day and per million output tokens (None without a price)."""

    replicas: list[ReplicaCountAnswer] = Field(description="Hour 0 to 23")
    slot_hours: list[Number] = Field(description="GPU-hours (CPU slot-hours on the CPU build) a day, [low, high]")
    cost_usd: Optional[list[Number]]
    cost_per_million_tokens_usd: Optional[list[Number]]


class PeakAnswer(Answer):
    """The peak rate planned for (`tuner.replicas.PeakRate`): req/s, where its window starts in the trace and its
    length (0 for a peak given by hand)."""

    rps: Number
    start_s: Number
    window_s: Number


class TrafficAnswer(Answer):
    """The traffic a plan is for (`tuner.study.capacity_plan.Traffic`) and where each part comes from."""

    trace: str = Field(description="Which requests: the whole trace file, not only the window the study replays")
    scale: Number = Field(description="The trace's recorded rate times this")
    scale_source: str
    peak: PeakAnswer
    peak_source: str
    hourly_rps: Optional[list[Number]] = Field(description="Hour 0 to 23; None: no daily curve (day_source says why)")
    day_source: str
    output_tokens_per_request: Optional[Number]


class ConfigurationPlanAnswer(Answer):
    """One configuration's plan (`tuner.study.capacity_plan.ConfigurationPlan`): its capacity and its source,
    replicas at the peak and over a day, its limiting resource and whether a setting or another replica relieves it."""

    role: str
    trial: int
    serve_command: str
    capacity: Optional[MeasuredCapacityAnswer]
    capacity_source: str
    slots_per_replica: int = Field(description="GPUs (CPU slots) per replica: its tensor_parallel_size")
    peak_replicas: Optional[ReplicaCountAnswer]
    day: Optional[DayPlanAnswer]
    limiting_resource: Optional[LimitingResourceAnswer]
    remedy: str


class PlanAnswer(Answer):
    """How many replicas carry the user's traffic within the boundary (`tuner.study.capacity_plan.CapacityPlan`):
    the headroom assumed (the share of each replica's capacity used), the unit of the hours, the traffic, and each
    configuration."""

    study: str
    headroom: Number
    unit: str = Field(description="GPU, or CPU slot")
    gpu_hour_usd: Optional[Number]
    traffic: TrafficAnswer
    configurations: list[ConfigurationPlanAnswer]
    notes: list[str]


class Studies(Protocol):
    """The study commands' answers, the same whether read here or asked of a service."""

    # What each promises. Those given a study's name raise NotFound when there is no such study (`create`: when
    # the study to warm-start from does not exist); each raises TunerError, with a message a user can act on, for
    # input it refuses.

    def create(self, request: StudyRequest) -> StudyCreated:
        """Create the study `request` describes, warm-started when it asks; its settings as stored. TunerError if
        the name is taken or the trace, model, space or boundary is refused."""

    def list(self) -> list[StudyListing]:
        """Every study, the oldest first, with its trial and feasible counts."""

    def status(self, name: str) -> StudyStatus:
        """The study's trials by state, those running and waiting, and its best so far (None while no trial met
        the boundary)."""

    def best(self, name: str) -> RecommendationAnswer:
        """The configuration the study recommends; NoRecommendation while no trial met its boundary."""

    def enqueue(self, name: str, assignments: list[str]) -> Enqueued:
        """Queue the configuration that the `NAME=VALUE` assignments give to run next in the study; TunerError for a
        setting its space fixes otherwise or does not search."""

    def export(self, name: str, format: str, requests: bool) -> str:
        """The study as text in `format`: "json" (its settings, recommendation and trials; with `requests`, each
        trial's requests too) or "csv" (one row per trial); TunerError for any other format."""

    def capacity_plan(self, name: str, options: PlanOptions) -> PlanAnswer:
        """How many replicas of vLLM's default, the recommendation and the best at the model's own precision carry
        the traffic `options` give; TunerError where the study has nothing measured or the traffic cannot be had."""

    def report(self, name: str) -> ReportAnswer:
        """The report's text parts and its summary."""

    def report_html(self, name: str) -> str:
        """The report as one self-contained HTML page (its plots included, nothing fetched)."""


EXPORT_FORMATS = ("json", "csv")
CSV_FIELDS = ["trial_number", "attempt", "state", "pareto", "failure_class", "completed", "requests",
              "completed_rps", "output_tps", "ttft_p95_s", "e2e_p95_s", "preemptions", "feasible", "serve_command",
              "validation", "startup_s", "probes_s", "draining_s", "compile_cache"]


def _validation_cell(mark: ValidationMark | None) -> str:
    """A validation launch in the CSV export: `1/2/default` or `1/2/trial 3` (validation, round, what it
    launched); empty for a search trial."""
    if mark is None:
        return ""
    return f"{mark.run}/{mark.round}/{'default' if mark.default else f'trial {mark.of_trial}'}"


def _given(value, default):
    """The request's value, or the default where it left the option out."""
    return default if value is None else value


class LocalStudies:
    """`Studies`, answered from the storage itself: each method keeps the protocol's promise."""

    def __init__(self, plan):
        self.plan = plan

    def _open(self, name: str):
        repo = self.plan.repository()
        return repo, repo.get_study(name), load_optuna_study(name, self.plan)

    def create(self, request: StudyRequest) -> StudyCreated:
        """`Studies.create` on this process's storage; the storage URL it answers has its password redacted."""
        # lazy: keeps the CLI's start fast (the search spaces' models, YAML)
        from tuner.study.create import create_study, latest_trace, study_defaults
        from tuner.study.warm_start import warm_start

        if request.trace and request.trace_latest:
            raise TunerError("give a trace or a folder to take the latest trace from, not both")
        trace = latest_trace(Path(request.trace_latest)) if request.trace_latest else request.trace
        if request.warm_from is not None:
            self.plan.repository().get_study(request.warm_from)  # before anything is created
        chosen, policy = study_defaults(own_trace=trace is not None)
        new = create_study(
            request.name, model=request.model or default_model(), trace_path=trace or bundled_trace(),
            selection=TraceSelection.from_options(
                request.window, _given(request.max_requests, chosen.max_requests),
                _given(request.rate_scale, chosen.rate_scale), _given(request.fit, chosen.fit), request.spread),
            space=request.space, boundary_name=request.boundary, limits=parse_limits(request.limits),
            plan=self.plan, sampler=request.sampler, seed=request.seed,
            request_timeout_s=request.request_timeout_s, startup_timeout_s=request.startup_timeout_s,
            load=LoadPolicy.from_options(request.load, _given(request.precision, policy.precision),
                                         request.probe_budget, request.load_range, request.probe_requests,
                                         _given(request.probe_seconds, policy.probe_seconds)),
            allow_fp8=request.allow_fp8)
        created = {**new.settings.to_dict(), "storage": redact_url(self.plan.url),
                   "probe_length": new.probe_length.to_dict()}
        if request.warm_from is not None or request.trace_latest is not None:
            carried = warm_start(request.name, self.plan, request.warm_from)
            created["warm_start"] = carried.to_dict() if carried else None
        return StudyCreated.model_validate(created)

    def list(self) -> list[StudyListing]:
        """`Studies.list` from this process's storage."""
        repo = self.plan.repository()
        rows = []
        for s in repo.list_studies():
            trials = repo.trials(s.name)
            rows.append(StudyListing(name=s.name, created_at=s.created_at, boundary=s.boundary, space=s.space_name,
                                     trace=Path(s.trace_path).name, trials=len(trials),
                                     feasible=sum(t.feasible for t in trials)))
        return rows

    def status(self, name: str) -> StudyStatus:
        """`Studies.status` from this process's storage."""
        repo, settings, study = self._open(name)
        stored = repo.trials(name)
        base = find_baseline(stored, study)
        states: dict[str, int] = {}
        for t in stored:
            states[t.state] = states.get(t.state, 0) + 1
        running = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        waiting = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
        rec = recommend(repo, settings, study)
        bound = boundary(settings.boundary, settings.limits)

        def held_by(t: StoredTrial) -> dict[str, Any] | None:
            found = trial_limit(t, bound)
            return found.to_dict() if found else None

        return StudyStatus.model_validate({
            "name": name, "boundary": settings.boundary, "trials": len(stored), "by_state": states,
            "running": running, "waiting": waiting,
            "best": {"trial": rec.trial.trial_number, **rec.trial.scored.to_dict(),
                     "serve_command": rec.trial.serve_command, **RecommendationContext.of(rec, settings).to_dict(),
                     "limiting_resource": held_by(rec.trial)}
            if rec else None,
            "baseline": {**baseline_dict(base), "limiting_resource": held_by(base)} if base else None,
            "validation_launches": sum(t.validation is not None for t in stored),
            "validation": rec.validation.sentence() if rec and rec.validation else "not validated",
            "spent": Spend.of(stored, repo.runs(name)).to_dict()})

    def best(self, name: str) -> RecommendationAnswer:
        """`Studies.best` from this process's storage."""
        repo, settings, study = self._open(name)
        rec = recommend(repo, settings, study)
        if rec is None:
            raise NoRecommendation(f"study {name}: no trial met the {settings.boundary} boundary yet")
        spent = Spend.of(repo.trials(name), repo.runs(name))
        return RecommendationAnswer.model_validate({**recommendation_dict(rec, settings), "spent": spent.to_dict()})

    def enqueue(self, name: str, assignments: list[str]) -> Enqueued:
        """`Studies.enqueue` into this process's storage."""
        # lazy: keeps the CLI's start fast (the search spaces' models, YAML)
        from tuner.study.create import enqueue_config

        config = EngineConfig.from_assignments(assignments)
        enqueue_config(name, self.plan, config)
        return Enqueued(study=name, engine_config=config.to_dict())

    def export(self, name: str, format: str, requests: bool) -> str:
        """`Studies.export` from this process's storage."""
        if format not in EXPORT_FORMATS:
            raise TunerError(f"--format must be json or csv, got {format!r}")
        repo, settings, study = self._open(name)
        trials = repo.trials(name)
        pareto = {t.number for t in study.best_trials}
        if format == "json":
            rows = []
            for t in trials:
                row = {**t.to_dict(), "pareto": t.trial_number in pareto}
                if requests:
                    row["requests"] = [r.to_dict() for r in repo.requests(name, t.trial_number)]
                rows.append(row)
            rec = recommend(repo, settings, study)
            return json.dumps({"study": settings.to_dict(),
                               "recommendation": recommendation_dict(rec, settings) if rec else None,
                               "spent": Spend.of(trials, repo.runs(name)).to_dict(),
                               "trials": rows}, indent=2, default=str) + "\n"
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for t in trials:
            m = t.measurement
            own = GpuTime.of_trial(t)
            measured = {"completed": m.completed, "requests": m.requests, "completed_rps": m.completed_rps,
                        "output_tps": m.output_tps, "ttft_p95_s": m.ttft_s.p95, "e2e_p95_s": m.e2e_s.p95,
                        "preemptions": m.preemptions} if m else {}
            writer.writerow({"trial_number": t.trial_number, "attempt": t.attempt, "state": t.state.value,
                             "pareto": t.trial_number in pareto, "failure_class": t.failure_class, **measured,
                             "feasible": t.score.feasible if t.score else None, "serve_command": t.serve_command,
                             "validation": _validation_cell(t.validation),
                             **({"startup_s": own.startup_s, "probes_s": own.probes_s, "draining_s": own.draining_s,
                                 "compile_cache": t.timings.compile_cache.value} if t.timings else {})})
        return buffer.getvalue()

    def capacity_plan(self, name: str, options: PlanOptions) -> PlanAnswer:
        """`Studies.capacity_plan` from this process's storage; the plan's summary is kept in the study's user
        attributes (CAPACITY_PLAN_ATTR), where the dashboard shows the latest one."""
        repo, settings, study = self._open(name)
        plan = plan_capacity(repo, settings, study, options)
        study.set_user_attr(CAPACITY_PLAN_ATTR, plan.summary())
        return PlanAnswer.model_validate(plan.to_dict())

    def report(self, name: str) -> ReportAnswer:
        """The report's text parts and its summary; `report_html` is the page with the plots."""
        # lazy: keeps the CLI's start fast (Jinja2)
        from tuner.report import collect_report, common_settings, recommendation_lines, side_by_side, summary, \
            trial_rows

        data = collect_report(name, self.plan)
        base, rec = data.baseline, data.recommended
        return ReportAnswer(summary=summary(data), recommended=data.recommendation is not None,
                            lines=recommendation_lines(data), side_by_side=[list(row) for row in side_by_side(data)],
                            baseline_trial=base.trial_number if base else None,
                            recommended_trial=rec.trial_number if rec else None,
                            common_settings=common_settings(data),
                            trial_rows=[row.to_dict() for row in trial_rows(data)])

    def report_html(self, name: str) -> str:
        """`Studies.report_html` from this process's storage and artifacts."""
        # lazy: keeps the CLI's start fast (Jinja2)
        from tuner.report import collect_report, render_html

        return render_html(collect_report(name, self.plan))
