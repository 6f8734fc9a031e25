"""What the storage layer takes and gives back: plain frozen values, never ORM rows."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.workers.measure import TrialRecord
from tuner.workers.replay import RequestRecord

BOUNDARIES = ("interactive", "batch")
TRIAL_STATES = ("complete", "failed", "pruned", "infeasible", "worker_lost", "stopped", "interrupted")


@dataclass(frozen=True)
class StudySettings:
    """Everything a study was started with, so that it can be resumed or reported as it was run."""

    name: str
    created_at: str  # ISO 8601, UTC
    model: str  # path as given
    model_info: dict
    trace_path: str
    trace_sha256: str
    trace_selection: dict  # window, rate scale, request cap... as chosen by the user
    boundary: str  # "interactive" or "batch"
    limits: dict  # the user's overrides of the boundary's limits
    space_name: str
    space_text: str  # the search space's YAML, verbatim
    sampler: str
    seed: int | None
    request_timeout_s: float
    startup_timeout_s: float
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}, not {self.boundary!r}")


@dataclass(frozen=True)
class StoredTrial:
    """One run of one configuration, as stored: the measurement record plus how the study judged it."""

    study_name: str
    trial_number: int  # Optuna's
    attempt: int  # 1 for the first run of this trial number
    state: str  # one of TRIAL_STATES
    engine_config: dict
    serve_command: str
    measurement: dict | None  # Measurement.to_dict(); None when the engine never served
    failure_class: str | None
    failure_message: str | None
    log_excerpt: str | None
    estimated_max_model_len: int | None
    exit_code: int | None
    timings: dict
    hardware: dict
    vllm_version: str
    started_at: str
    finished_at: str | None
    score: dict  # objectives, constraints, feasible: as the caller computed them
    prune_reason: str | None = None
    id: int | None = field(default=None, compare=False)  # the row's, once stored

    def __post_init__(self) -> None:
        if self.state not in TRIAL_STATES:
            raise ValueError(f"trial state must be one of {', '.join(TRIAL_STATES)}, not {self.state!r}")

    @classmethod
    def from_record(cls, study_name: str, trial_number: int, record: TrialRecord, *, state: str, score: dict,
                    attempt: int = 1, prune_reason: str | None = None,
                    finished_at: str | None = None) -> StoredTrial:
        data = record.to_dict()
        failure = data["failure"] or {}
        return cls(
            study_name=study_name, trial_number=trial_number, attempt=attempt, state=state,
            engine_config=data["engine_config"], serve_command=record.serve_command,
            measurement=data["measurement"], failure_class=failure.get("kind"),
            failure_message=failure.get("message"), log_excerpt=failure.get("log_excerpt"),
            estimated_max_model_len=failure.get("estimated_max_model_len"), exit_code=failure.get("exit_code"),
            timings=data["timings"], hardware=data["hardware"], vllm_version=record.vllm_version,
            started_at=record.started_at, finished_at=finished_at, score=score, prune_reason=prune_reason,
        )


@dataclass(frozen=True)
class StoredRequest:
    """One replayed request of a trial, as stored."""

    index: int
    scheduled_s: float
    sent_s: float | None
    requested_tokens: int
    input_tokens: int
    output_tokens: int
    outcome: str  # an Outcome's value
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_mean_s: float | None = None
    itl_p95_s: float | None = None
    itl_max_s: float | None = None
    status_code: int | None = None
    error: str | None = None

    @classmethod
    def from_record(cls, record: RequestRecord) -> StoredRequest:
        return cls(**record.to_dict())
