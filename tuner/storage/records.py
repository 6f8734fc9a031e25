"""What the storage layer takes and gives back: plain frozen records, never ORM rows.

Each record has one serializer: `to_dict` gives the values as stored (the JSON columns' shapes), `from_dict` reads
them back into the same record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from tuner.common.hardware import HardwareInfo
from tuner.analysis.kv_budget import ModelMemory
from tuner.common.models import ModelInfo
from tuner.analysis.capacity import JudgedProbe, LoadPolicy
from tuner.analysis.scoring import BOUNDARIES, Rejection, Score
from tuner.traces.records import TraceFit
from tuner.traces.selection import TraceSelection
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement, TrialTimings
from tuner.workers.trial import TrialRecord


class TrialState(StrEnum):
    """How a stored trial ended. A str: stored, printed and exported as its value."""

    COMPLETE = "complete"  # served and scored
    FAILED = "failed"  # the engine failed, or no request finished
    PRUNED = "pruned"  # stopped early: its boundary could no longer be met
    INFEASIBLE = "infeasible"  # rejected by the search space's rules before launch
    WORKER_LOST = "worker_lost"  # its Ray worker died: run again
    STOPPED = "stopped"  # in flight when the run was stopped: run again
    INTERRUPTED = "interrupted"  # its driver died (no heartbeat): run again


@dataclass(frozen=True)
class StudyModel:
    """What a study stored about its model when it was created, so that runs and reports need not read the
    folder again. `memory` is None for a study created before the model's sizes were stored."""

    architecture: str
    vocab_size: int
    max_position_embeddings: int
    kv_bytes_per_token: int
    memory: ModelMemory | None = None

    @classmethod
    def of(cls, info: ModelInfo, memory: ModelMemory) -> StudyModel:
        """What is kept of a model folder read at the study's creation."""
        return cls(info.architecture, info.vocab_size, info.max_position_embeddings, info.kv_bytes_per_token, memory)

    def to_dict(self) -> dict[str, Any]:
        """As stored: `memory` only when known."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "memory"}
        if self.memory is not None:
            data["memory"] = asdict(self.memory)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyModel:
        """The record `to_dict` gave."""
        memory = data.get("memory")
        return cls(**{**data, "memory": ModelMemory(**memory) if memory else None})


@dataclass(frozen=True)
class StudySettings:
    """Everything a study was started with, so that it can be resumed or reported as it was run."""

    name: str
    created_at: str  # ISO 8601, UTC
    model: str  # path as given
    model_info: StudyModel
    trace_path: str
    trace_sha256: str
    trace_selection: TraceSelection  # window, rate scale, request cap... as chosen by the user
    boundary: str  # a name in tuner.analysis.scoring.BOUNDARIES
    limits: dict[str, float | None]  # the user's overrides of the boundary's limits, by limit name (None lifts one)
    space_name: str
    space_text: str  # the search space's YAML, verbatim
    sampler: str
    seed: int | None
    request_timeout_s: float
    startup_timeout_s: float
    load: LoadPolicy = field(default_factory=LoadPolicy)
    # FP8 weights and KV cache may be searched: they change the model's numerics, so only where its creator allowed
    # it (`--allow-fp8`).
    allow_fp8: bool = False

    def __post_init__(self) -> None:
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}, not {self.boundary!r}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as stored (and exported): JSON-ready values."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(model_info=self.model_info.to_dict(), trace_selection=self.trace_selection.to_dict(),
                    load=self.load.to_dict(),
                    # The studies table keeps a column of this name, always empty: dropping it would take a
                    # migration, and exports and answers have always carried it.
                    extra={})
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudySettings:
        """The settings `to_dict` gave (other keys, such as the row's id and `extra`, are left out)."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name != "load"}
        values.update(model_info=StudyModel.from_dict(data["model_info"]),
                      trace_selection=TraceSelection.from_dict(data["trace_selection"]),
                      load=LoadPolicy.from_dict(data.get("load")))
        return cls(**values)


@dataclass(frozen=True)
class ValidationMark:
    """What a validation launch (tuner.validation) is: which validation of the study (from 1), which round (from
    1; each arm is launched once per round, in the same order) of how many planned, which arm (0 is vLLM's
    default), the search trial whose configuration it launches again (None for vLLM's default), and whether it was
    measured paired: one round of an engine that every arm's engine took turns with on one GPU, through vLLM's
    sleep mode (`tuner.workers.paired`), rather than a launch of its own."""

    run: int
    round: int
    repeats: int
    arm: int
    of_trial: int | None
    paired: bool = False  # rows stored before pairing came have no such key: their launches were interleaved

    @property
    def default(self) -> bool:
        """Whether this launch runs vLLM's default configuration."""
        return self.of_trial is None

    def to_dict(self) -> dict[str, Any]:
        """As stored (the trial's `validation` column and its Optuna user attribute)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ValidationMark:
        """The mark `to_dict` gave."""
        return cls(**data)



@dataclass(frozen=True)
class StoredRun:
    """One `tuner study run` (or validation) on its slots: when it began and last ended a trial, how many slots it
    held and of what kind, its budget if it had one, and the trials it ran. The slots' time the run held beyond its
    trials' own is what they stood idle (`tuner.storage.spend`)."""

    study_name: str
    started_at: float  # time.time()
    ended_at: float  # time.time() when it ended, or when it last ended a trial (a run that died keeps that)
    slots: int
    gpus_per_slot: int  # 0 for CPU slots
    trials: tuple[int, ...] = ()  # the trial numbers it launched, validation launches included
    budget_s: float | None = None  # the slots' time it was given (`--budget`), summed over slots
    id: int | None = field(default=None, compare=False)  # the row's, once stored

    @property
    def held_s(self) -> float:
        """The slots' time the run held, summed over its slots."""
        return self.slots * max(0.0, self.ended_at - self.started_at)

    def to_dict(self) -> dict[str, Any]:
        """As stored, without the row's id."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "id"}
        data["trials"] = list(self.trials)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StoredRun:
        """The run `to_dict` gave, with its row's id when `data` has one."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["trials"] = tuple(values.get("trials") or ())
        return cls(**values)


@dataclass(frozen=True)
class StoredScheduleRun:
    """One run of a schedule (`tuner.schedules`), as stored: when it was due, started, was to end and ended, and its
    morning summary, the JSON that `tuner.schedule_runs.ScheduleRun` writes and reads back."""

    schedule: str
    study: str
    state: str  # a tuner.supervisor.RunState's value
    due_at: str  # ISO 8601 with the host's offset
    started_at: str
    window_end: str
    finished_at: str | None  # None while it runs
    summary: dict[str, Any]
    id: int | None = field(default=None, compare=False)  # the row's, once stored

    def to_dict(self) -> dict[str, Any]:
        """As stored, without the row's id."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "id"}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StoredScheduleRun:
        """The run `to_dict` gave, with its row's id when `data` has one."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _score_from_dict(data: dict[str, Any]) -> Score | Rejection | None:
    """The score column: a Score when the trial was scored, a Rejection when its proposal was refused before
    launch, empty otherwise."""
    if not data:
        return None
    return Score.from_dict(data) if "completed_rps" in data else Rejection.from_dict(data)


@dataclass(frozen=True)
class StoredTrial:
    """One run of one configuration, as stored: the measurement record plus how the study judged it."""

    study_name: str
    trial_number: int  # Optuna's
    attempt: int  # 1 for the first run of this trial number
    state: TrialState
    engine_config: EngineConfig
    serve_command: str
    measurement: Measurement | None  # None when the engine never served
    failure_class: str | None
    failure_message: str | None
    log_excerpt: str | None
    estimated_max_model_len: int | None
    exit_code: int | None
    timings: TrialTimings | None  # None when nothing was launched, or nothing came back from the launch
    hardware: HardwareInfo | None
    vllm_version: str
    started_at: str
    finished_at: str | None
    score: Score | Rejection | None  # a Score once served and scored; a Rejection if refused before launch
    prune_reason: str | None = None
    probes: list[JudgedProbe] = field(default_factory=list)  # the first at the reference load; none at a fixed load
    validation: ValidationMark | None = None  # a validation launch (tuner.validation); None for a search trial
    trace_fit: TraceFit | None = None  # how its trace was fitted to its max_model_len; None: lengths as recorded
    id: int | None = field(default=None, compare=False)  # the row's, once stored

    def __post_init__(self) -> None:
        # A plain string (as a test or an older caller gives it) becomes the state it names, or is refused.
        try:
            object.__setattr__(self, "state", TrialState(self.state))
        except ValueError:
            raise ValueError(f"trial state must be one of {', '.join(TrialState)}, not {self.state!r}") from None

    @property
    def feasible(self) -> bool:
        """Complete, scored, and within its boundary: a candidate for the recommendation."""
        return self.state is TrialState.COMPLETE and isinstance(self.score, Score) and self.score.feasible

    @property
    def scored(self) -> Score | None:
        """The score of a trial that served and was scored (feasible or not); None for any other."""
        return self.score if isinstance(self.score, Score) else None

    def to_dict(self) -> dict[str, Any]:
        """The trial as stored (and exported), without the row's id: JSON-ready values."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "id"}
        data.update(state=self.state.value, engine_config=self.engine_config.to_dict(),
                    measurement=self.measurement.to_dict() if self.measurement else None,
                    timings=self.timings.to_dict() if self.timings else {},
                    hardware=self.hardware.to_dict() if self.hardware else {},
                    score=self.score.to_dict() if self.score else {},
                    probes=[p.to_dict() for p in self.probes],
                    validation=self.validation.to_dict() if self.validation else None,
                    trace_fit=self.trace_fit.to_dict() if self.trace_fit else None)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StoredTrial:
        """The trial `to_dict` gave, with its row's id when `data` has one (other keys are left out)."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values.update(engine_config=EngineConfig.from_dict(data["engine_config"]),
                      measurement=Measurement.from_dict(data["measurement"]) if data["measurement"] else None,
                      timings=TrialTimings.from_dict(data["timings"]) if data["timings"] else None,
                      hardware=HardwareInfo.from_dict(data["hardware"]) if data["hardware"] else None,
                      score=_score_from_dict(data["score"]),
                      probes=[JudgedProbe.from_dict(p) for p in data.get("probes") or []],
                      validation=ValidationMark.from_dict(data["validation"]) if data.get("validation") else None,
                      trace_fit=TraceFit(**data["trace_fit"]) if data.get("trace_fit") else None)
        return cls(**values)

    @classmethod
    def from_record(cls, study_name: str, trial_number: int, record: TrialRecord, *, state: TrialState,
                    score: Score | None, attempt: int = 1, prune_reason: str | None = None,
                    finished_at: str | None = None, probes: list[JudgedProbe] | None = None,
                    validation: ValidationMark | None = None) -> StoredTrial:
        """A trial that was launched, from its worker's record and the study's verdict on it."""
        failure = record.failure
        return cls(
            study_name=study_name, trial_number=trial_number, attempt=attempt, state=state,
            engine_config=record.engine_config, serve_command=record.serve_command,
            measurement=record.measurement, failure_class=failure.kind.value if failure else None,
            failure_message=failure.message if failure else None,
            log_excerpt=failure.log_excerpt if failure else None,
            estimated_max_model_len=failure.estimated_max_model_len if failure else None,
            exit_code=failure.exit_code if failure else None, timings=record.timings, hardware=record.hardware,
            vllm_version=record.vllm_version, started_at=record.started_at, finished_at=finished_at, score=score,
            prune_reason=prune_reason, probes=probes or [], validation=validation, trace_fit=record.trace.fit,
        )
