"""The parts the study commands' answers are built of, each the JSON of one record (a score, a capacity, the
machine, a validation, a capacity plan), declared for the service's OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from tuner.analysis.kv_budget import ModelMemory


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
    """How long the study's trials will replay (`tuner.analysis.capacity.ProbeLength`): its probe at the reference load
    (the requests, their offered req/s and how long their arrivals last), how long any other probe's arrivals last at
    least, a trial's probes at most, and the least a trial that runs them all replays for."""

    requests: int
    offered_rps: Number
    arrival_s: Number
    least_arrival_s: Number
    probes: int
    trial_arrival_s: Number


class TraceAnswer(Answer):
    """The trace a recommendation was measured on: its path, the sha256 of its bytes, and the selection replayed."""

    path: str
    sha256: str
    selection: TraceSelectionAnswer


class BoundaryAnswer(Answer):
    """The limits a recommendation meets (`tuner.analysis.scoring.Boundary`); None where the boundary sets no limit."""

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
    """The machine a trial ran on (`tuner.common.hardware.HardwareInfo`); the GPU fields describe the first GPU."""

    accelerator: str = Field(description="cuda or cpu")
    gpu_model: Optional[str]
    gpu_memory_gib: Optional[Number]
    gpu_count: int
    cpu_model: str
    cpu_cores: int
    memory_gib: Number


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
    probes run, and why the search ended (`tuner.analysis.scoring.Capacity`)."""

    rps: Optional[Number]
    factor: Optional[Number]
    rate_scale: Optional[Number]
    edge_rps: Optional[Number]
    probes: int
    ended: str


class ScoreAnswer(Answer):
    """A trial's score as stored (`tuner.analysis.scoring.Score`): completed throughput, p95 end-to-end latency, output
    rate and completion ratio, each limit's distance (<= 0 when met) and the violations, its capacity after a load
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


class RejectionAnswer(Answer):
    """A proposal the search space's rules refused before launch (`tuner.analysis.scoring.Rejection`): never
    feasible."""

    feasible: bool
    violations: list[str]


class LimitingResourceAnswer(Answer):
    """What holds a configuration back at the load where it stops meeting its boundary
    (`tuner.analysis.diagnosis.LimitingResource`): the kind of limit, that load, the figures behind it and a
    sentence."""

    kind: str
    at_rps: Optional[Number]
    evidence: JsonObject
    sentence: str


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


class MeasuredCapacityAnswer(Answer):
    """A configuration's capacity within the boundary (`tuner.analysis.replicas.MeasuredCapacity`), req/s: the central
    value, its 95% interval (the high end None where unbounded) and the launches behind it (1: measured once)."""

    rps: Number
    low: Number
    high: Optional[Number]
    launches: int
    measured_once: bool


class ReplicaCountAnswer(Answer):
    """Replicas that carry a rate (`tuner.analysis.replicas.ReplicaCount`): at the capacity's high end and at its low
    end."""

    low: int
    high: int


class DayPlanAnswer(Answer):
    """One configuration over a day (`tuner.analysis.replicas.DayPlan`): replicas per hour, and [low, high] of its
    slot-hours, its cost per day and per million output tokens (None without a price)."""

    replicas: list[ReplicaCountAnswer] = Field(description="Hour 0 to 23")
    slot_hours: list[Number] = Field(description="GPU-hours (CPU slot-hours on the CPU build) a day, [low, high]")
    cost_usd: Optional[list[Number]]
    cost_per_million_tokens_usd: Optional[list[Number]]


class PeakAnswer(Answer):
    """The peak rate planned for (`tuner.analysis.replicas.PeakRate`): req/s, where its window starts in the trace and
    its length (0 for a peak given by hand)."""

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
