"""A study: Optuna proposes engine configurations, each is run as a real trial, scored and remembered.

Optuna keeps the search (its RDBStorage: trials, parameters, objective values, constraints); the project's
tables keep what was measured (storage.Repository). One database holds both. Every study first runs vLLM's
default configuration (the search space's fixed values alone) as an enqueued baseline.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import optuna
import ray
from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState
from sqlalchemy.exc import OperationalError

from tuner.search_spaces import PREDICTED_KV_INSUFFICIENT, SearchSpace, SpaceContext, load_space, parse_space
from tuner.search_spaces.derive import AUTO_SPACE, derive_space
from tuner.storage import DatabaseUnreachable, Repository, StoredTrial, StudyModel, StudySettings, TrialState
from tuner.storage.artifacts import attach_trial_artifacts
from tuner.storage.urls import default_artifact_dir, default_storage_url
from tuner.bottleneck import measurement_attrs
from tuner.errors import NotFound, TunerError
from tuner.hardware import detect_hardware
from tuner.kv_budget import (DeviceMemory, KvPrediction, ModelMemory, estimate_kv, logged_kv_tokens,
                             read_model_memory)
from tuner.models import ModelInfo, inspect_model
from tuner.pruning import BoundaryWatch
from tuner.samplers import DEFAULT_SAMPLER, make_sampler
from tuner.scoring import DIRECTIONS, OBJECTIVE_NAMES, Boundary, Rejection, Score, boundary, score
from tuner.traces.records import Trace
from tuner.traces.selection import TraceSelection, fit_trace, load_trace
from tuner.traces.stats import trace_stats
from tuner.workers.engine_config import EngineConfig
from tuner.workers.pool import WorkerLost, WorkerPool, WorkerResult
from tuner.workers.trial import ARTIFACTS, TrialOutcome, TrialSpec


# Heartbeats and retries are marked experimental, and Optuna warns when heartbeats are used outside
# study.optimize: this module drives them itself (see _Heartbeat), deliberately.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
optuna.logging.set_verbosity(optuna.logging.WARNING)
BASELINE_ATTR = "baseline"
RERUN_ATTR = "rerun_of"  # a configuration re-run because its worker was lost or its run stopped mid-trial
WARM_START_ATTR = "warm_start_from"  # a configuration carried over from an earlier study
KV_PREDICTION_ATTR = "kv_prediction"  # a launched trial's estimated KV cache (KvPrediction.to_dict())...
KV_LOGGED_ATTR = "kv_logged_tokens"  # ...and the size vLLM then logged, beside its state and failure class
WINDOW_END = "stopped at the window's end"
NO_TIME_LEFT = "no time left in the window for another trial"
# Proposals rejected before launch cost no trial of a run's budget, up to this many in a row (a space whose
# rules reject almost everything must still end).
MAX_REJECTED_IN_A_ROW = 20
# How often a run with trials in flight looks at the clock and for a stop request.
STOP_POLL_S = 1.0

_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[hms])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `5h`, `30m`, `90s` or `1h30m` (a bare number is seconds)."""
    compact = text.strip().lower().replace(" ", "")
    try:
        seconds = float(compact)
    except ValueError:
        if not _DURATION.fullmatch(compact):
            raise TunerError(f"a duration is like 5h, 30m, 90s or 1h30m, got {text!r}") from None
        seconds = sum(float(number) * _UNIT_S[unit] for number, unit in _DURATION_PART.findall(compact))
    if not math.isfinite(seconds) or seconds <= 0:
        raise TunerError(f"a duration must be more than 0 s, got {text!r}")
    return seconds


@dataclass(frozen=True)
class StoragePlan:
    """Where a study lives: the database URL and the folder of its trial artifacts."""

    url: str
    artifact_dir: Path
    heartbeat_interval_s: int = 30  # a running trial proves its driver alive this often...
    grace_period_s: int = 90  # ...and is taken for interrupted once silent this long

    @classmethod
    def resolve(cls, url: str | None, artifact_dir: str | Path | None = None, **kwargs) -> StoragePlan:
        url = url or default_storage_url()
        return cls(url, Path(artifact_dir) if artifact_dir else default_artifact_dir(url), **kwargs)

    def repository(self) -> Repository:
        repo = Repository(self.url)
        repo.migrate()
        return repo

    def optuna_storage(self) -> RDBStorage:
        return RDBStorage(self.url, heartbeat_interval=self.heartbeat_interval_s, grace_period=self.grace_period_s,
                          heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))


@dataclass(frozen=True)
class StudyContext:
    """A stored study made ready to run: its space, boundary and trace, checked against what was stored."""

    settings: StudySettings
    space: SearchSpace
    boundary: Boundary
    selection: TraceSelection
    trace: Trace  # windowed, capped, rate-scaled; fitted per trial
    space_context: SpaceContext


def _stored_space(settings: StudySettings) -> SearchSpace:
    """The space exactly as stored with the study (the file it came from may have changed since). Parsed from
    the stored text, never through a shared scratch file: drivers starting at once would read half-written ones."""
    return parse_space(settings.space_text, Path(f"{settings.space_name}.yaml"))


def study_context(settings: StudySettings, plan: StoragePlan) -> StudyContext:
    """The stored study made ready to run; TunerError if its trace file changed since it was created."""
    selection = settings.trace_selection
    trace = load_trace(settings.trace_path, selection)
    if trace.sha256 != settings.trace_sha256:
        raise TunerError(f"{settings.trace_path} changed since study {settings.name!r} was created "
                         f"(sha256 {trace.sha256[:12]}, stored {settings.trace_sha256[:12]})")
    space = _stored_space(settings)
    # The model's sizes as stored at creation (no transformers import per run); a study created before they
    # were stored reads them from the folder.
    memory = settings.model_info.memory or read_model_memory(settings.model)
    return StudyContext(settings, space, boundary(settings.boundary, settings.limits), selection, trace,
                        machine_space_context(inspect_model(settings.model), memory, trace, selection.fit))


def machine_space_context(info: ModelInfo, memory: ModelMemory, trace: Trace, fit: str | None) -> SpaceContext:
    """What a proposal is judged against on this machine, its estimated KV cache included."""
    hardware = detect_hardware()
    platform = "cuda" if hardware.accelerator == "cuda" else "cpu"
    return SpaceContext.for_run(platform, info, trace, fit, memory, DeviceMemory.of_machine(hardware))


def create_study(name: str, *, model: str | Path, trace_path: str | Path, selection: TraceSelection,
                 space: str | Path, boundary_name: str, limits: dict, plan: StoragePlan, sampler: str = DEFAULT_SAMPLER,
                 seed: int | None = None, request_timeout_s: float = 600.0,
                 startup_timeout_s: float = 600.0) -> StudySettings:
    """Check everything a run will need, then store the study and enqueue its baseline."""
    if not name or len(name) > 200:
        raise TunerError("a study name must be 1 to 200 characters")
    make_sampler(sampler, seed)
    bound = boundary(boundary_name, limits)
    info = inspect_model(model)
    trace = load_trace(trace_path, selection)
    memory = read_model_memory(model)
    space_context = machine_space_context(info, memory, trace, selection.fit)
    loaded_space = (derive_space(memory, space_context.device, trace, selection.fit).space
                    if str(space) == AUTO_SPACE else load_space(space))
    refused = loaded_space.violations(loaded_space.baseline(), space_context)
    if refused:
        raise TunerError(f"the space's baseline (its fixed values) would be refused: {'; '.join(refused)}")
    repo = plan.repository()
    storage = plan.optuna_storage()
    if name in {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)} \
            or name in {s.name for s in repo.list_studies()}:
        raise TunerError(f"study {name} already exists")
    settings = StudySettings(
        name=name, created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model=str(Path(model).resolve()),
        model_info=StudyModel.of(info, memory),
        trace_path=str(Path(trace_path).resolve()), trace_sha256=trace.sha256, trace_selection=selection,
        boundary=bound.name, limits=limits, space_name=loaded_space.name, space_text=loaded_space.text,
        sampler=sampler, seed=seed, request_timeout_s=request_timeout_s, startup_timeout_s=startup_timeout_s)
    repo.save_study(settings)
    repo.save_trace(trace, trace_stats(trace))
    study = optuna.create_study(study_name=name, storage=storage, directions=list(DIRECTIONS))
    study.set_metric_names(list(OBJECTIVE_NAMES))
    study.set_user_attr("boundary", bound.to_dict())
    study.set_user_attr("space", loaded_space.name)
    study.enqueue_trial({}, user_attrs={BASELINE_ATTR: True})
    return settings


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

    def to_dict(self) -> dict:
        """JSON-ready: what `tuner study run --json` and the run's events file hold for the trial."""
        return {"number": self.number, "state": self.state.value, "baseline": self.baseline,
                "config": self.config.to_dict(), "score": self.score.to_dict() if self.score else None,
                "failure_class": self.failure_class, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict) -> TrialSummary:
        """The summary `to_dict` gave (as the service sends a run's progress)."""
        return cls(data["number"], TrialState(data["state"]), data["baseline"], EngineConfig.from_dict(data["config"]),
                   Score.from_dict(data["score"]) if data["score"] else None, data["failure_class"], data["reason"])


@dataclass
class RunReport:
    """What a run did: every trial it ended, and why it stopped before its budget if it did."""

    trials: list[TrialSummary] = field(default_factory=list)
    stopped_early: str | None = None  # why fewer trials ran than asked

    def to_dict(self) -> dict:
        """JSON-ready: what `tuner study run --json` prints."""
        return {"trials": [t.to_dict() for t in self.trials], "stopped_early": self.stopped_early}

    @classmethod
    def from_dict(cls, data: dict) -> RunReport:
        """The report `to_dict` gave (as a run on the service hands it back)."""
        return cls([TrialSummary.from_dict(t) for t in data["trials"]], data["stopped_early"])


# What a run tells its caller as it goes (`StudyRunner(on_event=...)`): one record per kind of event.


@dataclass(frozen=True)
class PoolReady:
    """The workers are up; no trial is in flight yet."""

    slots: int
    pool: WorkerPool


@dataclass(frozen=True)
class TrialStarted:
    """A trial was asked of Optuna and is about to be checked and launched on a slot."""

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

    summary: TrialSummary


RunEvent = PoolReady | TrialStarted | WorkerDone | TrialDone


class _Heartbeat:
    """Proves the driver alive for one running trial, as study.optimize would (ask/tell has no heartbeat)."""

    def __init__(self, storage: RDBStorage, trial_id: int, interval_s: float):
        self._storage, self._trial_id, self._interval = storage, trial_id, interval_s
        self._stop = threading.Event()
        storage.record_heartbeat(trial_id)
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except StorageInternalError:
                # The database is out of reach for now: beat again next time. Whether the run can go on is
                # decided when the trial's result is stored.
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _stops_when_the_database_is_lost(run: Callable) -> Callable:
    """The database lost mid-run (Optuna's side or tuner's tables) ends the run with one line naming it, not a
    traceback. The trials in flight stay RUNNING without heartbeat, so the next run re-runs them; every stored
    trial is kept."""

    @functools.wraps(run)
    def guarded(self: StudyRunner, *args, **kwargs):
        try:
            return run(self, *args, **kwargs)
        except (DatabaseUnreachable, OperationalError, StorageInternalError) as exc:
            # Optuna wraps the driver's error in its own, whatever its cause.
            lost = exc.__cause__ if isinstance(exc, StorageInternalError) else exc
            if isinstance(lost, OperationalError):
                lost = DatabaseUnreachable.from_error(self.plan.url, lost)
            elif not isinstance(lost, DatabaseUnreachable):
                raise
            raise DatabaseUnreachable(f"{lost}; the run stopped, the trials in flight will be run again by the "
                                      f"next `tuner study run`") from None

    return guarded


def _attempt(study: optuna.Study, trial: optuna.Trial) -> int:
    """1 for a first run; a configuration re-run after its driver died counts its earlier tries."""
    return len(RetryHeartbeatStaleTrialCallback.retry_history(study.get_trials(deepcopy=False)[trial.number])) + 1


def _expected_trial_s(repo: Repository, settings: StudySettings, trace_span_s: float) -> float:
    """How long the next trial will likely take: the median of the study's trials that served (a launch that
    failed fast says little); before any, of other studies' on the same model; before any, the trace's span,
    which no trial can take less than."""
    def served(name: str) -> list[float]:
        return [t.timings.total_s for t in repo.trials(name)
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.timings and t.timings.total_s]

    totals = served(settings.name) or [s for other in repo.list_studies() if other.name != settings.name
                                       and other.model == settings.model for s in served(other.name)]
    return statistics.median(totals) if totals else trace_span_s


@dataclass
class _InFlight:
    trial: optuna.Trial
    config: EngineConfig
    baseline: bool
    trace: Trace
    slot: int
    beat: _Heartbeat
    started_at: str  # ISO 8601, UTC
    slot_freed_at: float | None = None  # when the trial before it on this slot ended (time.time())


class StudyRunner:
    """Runs a stored study's trials on Ray workers, `parallel` at a time: ask, launch and measure on a slot,
    score, store, tell, and ask again as soon as a slot frees."""

    def __init__(self, name: str, plan: StoragePlan, *, prune: bool = True, parallel: int | None = None,
                 ray_address: str | None = None, on_event: Callable[[RunEvent], None] | None = None):
        self.plan = plan
        self.repo = plan.repository()
        self.settings = self.repo.get_study(name)
        self.ctx = study_context(self.settings, plan)
        self.storage = plan.optuna_storage()
        self.study = optuna.load_study(study_name=name, storage=self.storage)
        self.study.sampler = make_sampler(self.settings.sampler, self.settings.seed)
        self.prune = prune
        self.parallel = parallel
        self.ray_address = ray_address
        self._emit = on_event or (lambda event: None)
        self._stop_reason: str | None = None

    def stop(self, reason: str) -> None:
        """End the run from outside (another thread, a signal handler): no trial starts any more, the trials in
        flight are stopped and recorded as stopped with this reason, and `run` returns."""
        self._stop_reason = self._stop_reason or reason

    @_stops_when_the_database_is_lost
    def run(self, n_trials: int | None, deadline: float | None = None, *,
            stop_at: float | None = None) -> RunReport:
        """Up to n_trials trials (None: as many as time allows). None is started that the deadline or stop_at
        (time.time()) would cut short, judged by the median time of the study's finished trials; at stop_at the
        trials still in flight are stopped."""
        report = RunReport()
        ends = [t for t in (deadline, stop_at) if t is not None]
        last_end = min(ends) if ends else None

        def no_time_left() -> bool:
            return last_end is not None and time.time() + (
                _expected_trial_s(self.repo, self.settings, self.ctx.trace.span_s)) > last_end

        # Judged before Ray starts too: a run with no time for a trial costs no cluster, and its verdict does not
        # depend on how long a cluster takes to start.
        if n_trials != 0 and no_time_left():
            report.stopped_early = NO_TIME_LEFT
            return report
        tp = self.ctx.space.baseline().tensor_parallel_size or 1
        hardware = detect_hardware()
        with WorkerPool(self.parallel, ray_address=self.ray_address, tensor_parallel_size=tp,
                        local_gpus=hardware.gpu_count) as pool:
            self._emit(PoolReady(len(pool.slots), pool))
            free = [slot.index for slot in pool.slots]
            freed_at: dict[int, float] = {}
            in_flight: dict[ray.ObjectRef, _InFlight] = {}
            started = rejected = 0
            try:
                while True:
                    reason = self._stop_reason or (WINDOW_END if stop_at is not None and time.time() >= stop_at
                                                   else None)
                    if reason is not None:
                        report.stopped_early = reason
                        self._stop_in_flight(pool, in_flight, reason, report)
                        break
                    while free and (n_trials is None or started < n_trials) and report.stopped_early is None:
                        if no_time_left():
                            report.stopped_early = NO_TIME_LEFT
                            break
                        started += 1
                        # Trials of a driver that died (before this run or during it) are failed now and
                        # re-enqueued once with the same configuration, so the next ask runs them again.
                        fail_stale_trials(self.study)
                        self._record_interrupted()
                        job = self._start(pool, free[0])
                        if isinstance(job, TrialSummary):  # rejected before launch: the slot stays free
                            report.trials.append(job)
                            rejected += 1
                            if rejected <= MAX_REJECTED_IN_A_ROW:
                                started -= 1  # costs no trial of the budget, as long as proposals keep coming
                            continue
                        rejected = 0
                        job[0].slot_freed_at = freed_at.get(free[0])
                        in_flight[pool.submit(free.pop(0), job[1])] = job[0]
                    if not in_flight:
                        break
                    ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=STOP_POLL_S)
                    if not ready:
                        continue
                    ref = ready[0]
                    job = in_flight.pop(ref)
                    freed_at[job.slot] = time.time()
                    try:
                        result: WorkerResult = ray.get(ref)
                    except WorkerLost as exc:
                        report.trials.append(self._lost(job, exc))
                        pool.replace_worker(job.slot)
                        started -= 1  # the re-run of a lost trial does not use up the budget
                    else:
                        # Scheduling overhead: from the slot freeing to the launch of this trial's engine.
                        launched, freed = result.outcome.launched_at, job.slot_freed_at
                        waited = None if launched is None or freed is None else launched - freed
                        self._emit(WorkerDone(job.trial.number, job.slot, result.node, waited))
                        report.trials.append(self._finish(job, result))
                    finally:
                        job.beat.stop()
                    free.append(job.slot)
            finally:
                # Ctrl-C or any error: the pool's shutdown kills every worker and so every engine. The trials
                # in flight stay RUNNING without heartbeat, so the next driver re-runs them.
                for job in in_flight.values():
                    job.beat.stop()
        return report

    def _stop_in_flight(self, pool: WorkerPool, in_flight: dict[ray.ObjectRef, _InFlight], reason: str,
                        report: RunReport) -> None:
        """Kill the workers of the trials in flight (each engine dies with its worker), then record each trial:
        as it ended if it had just finished, else as stopped."""
        for job in in_flight.values():
            pool.kill_worker(job.slot)
        for ref, job in list(in_flight.items()):
            try:
                report.trials.append(self._finish(job, ray.get(ref)))
            except WorkerLost:
                pool.bring_back_files(job.slot)
                job.trial.set_user_attr("stop_reason", reason)
                report.trials.append(self._not_finished(job, TrialState.STOPPED, reason))
            finally:
                job.beat.stop()
                del in_flight[ref]

    def _config(self, trial: optuna.Trial) -> tuple[EngineConfig, bool]:
        baseline = bool(trial.user_attrs.get(BASELINE_ATTR))
        return (self.ctx.space.baseline() if baseline else self.ctx.space.suggest(trial)), baseline

    def _start(self, pool: WorkerPool, slot: int) -> tuple[_InFlight, TrialSpec] | TrialSummary:
        trial = self.study.ask()
        config, baseline = self._config(trial)
        number = trial.number
        trial.set_user_attr("engine_config", config.to_dict())
        trial.set_user_attr("serve_command", config.serve_command(self.settings.model))
        self._emit(TrialStarted(number, baseline, config, slot, time.time()))
        violations = self.ctx.space.violations(config, self.ctx.space_context)
        if violations:
            return self._infeasible(trial, config, baseline, violations)
        max_model_len = config.max_model_len or self.ctx.space_context.model_max_len
        self._record_prediction(trial, config, max_model_len)
        trace = fit_trace(self.ctx.trace, self.ctx.selection, max_model_len)
        spec = TrialSpec(Path(self.settings.model), trace, config, self._trial_dir(number),
                         startup_timeout_s=self.settings.startup_timeout_s,
                         request_timeout_s=self.settings.request_timeout_s,
                         # The baseline always runs to the end: every gain is measured against it.
                         stop_rule=BoundaryWatch(self.ctx.boundary, trace.span_s)
                         if self.prune and not baseline else None)
        # If this driver dies, the heartbeats stop and the next driver re-runs this configuration.
        beat = _Heartbeat(self.storage, trial._trial_id, self.plan.heartbeat_interval_s)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return _InFlight(trial, config, baseline, trace, slot, beat, started_at), spec

    def _record_prediction(self, trial: optuna.Trial, config: EngineConfig, max_model_len: int) -> None:
        """The KV cache expected of a configuration that is launched (near the margin or not), so that the real
        outcome is recorded beside it."""
        space_context = self.ctx.space_context
        if space_context.model_memory is None or space_context.device is None:
            return
        estimate = estimate_kv(space_context.model_memory, space_context.device, config)
        trial.set_user_attr(KV_PREDICTION_ATTR,
                            KvPrediction(estimate, max_model_len, estimate.fit(max_model_len)).to_dict())

    def _trial_dir(self, number: int) -> Path:
        return self.plan.artifact_dir / "trials" / self.settings.name / f"trial-{number:04d}"

    def _finish(self, job: _InFlight, result: WorkerResult) -> TrialSummary:
        """Bring the worker's files into the driver's artifact store, then score, store and tell."""
        out_dir = self._trial_dir(job.trial.number)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in result.files.items():
            (out_dir / name).write_bytes(data)
        record = dataclasses.replace(result.outcome.record, log_path=str(out_dir / "server.log"))
        outcome = dataclasses.replace(result.outcome, record=record)
        attach_trial_artifacts(self.study, job.trial, [out_dir / name for name in ARTIFACTS], self.plan.artifact_dir)
        return self._conclude(job.trial, job.config, job.baseline, outcome, job.trace)

    def _not_measured(self, trial: optuna.Trial | FrozenTrial, config: EngineConfig, state: TrialState,
                      rejection: Rejection | None = None, failure_class: str | None = None,
                      message: str | None = None, started_at: str | None = None) -> None:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.repo.save_trial(StoredTrial(
            study_name=self.settings.name, trial_number=trial.number, attempt=_attempt(self.study, trial),
            state=state, engine_config=config, serve_command=config.serve_command(self.settings.model),
            measurement=None, failure_class=failure_class, failure_message=message, log_excerpt=None,
            estimated_max_model_len=None, exit_code=None, timings=None, hardware=detect_hardware(),
            vllm_version="", started_at=started_at or now, finished_at=now, score=rejection, prune_reason=None), [])

    def _record_interrupted(self) -> None:
        """Trials whose driver died mid-trial (failed by their stale heartbeat) into the project's tables, so that
        export and reports hold every trial; their configurations run again from the queue."""
        recorded = {t.trial_number for t in self.repo.trials(self.settings.name)}
        for frozen in self.study.get_trials(deepcopy=False, states=(OptunaState.FAIL,)):
            if frozen.number in recorded or "engine_config" not in frozen.user_attrs:
                continue
            config = EngineConfig.from_dict(frozen.user_attrs["engine_config"])
            self._not_measured(frozen, config, TrialState.INTERRUPTED, message="its driver stopped before the "
                               "trial finished (no heartbeat); the configuration is run again")

    def _lost(self, job: _InFlight, exc: Exception) -> TrialSummary:
        """The worker (or its node) died mid-trial: not the configuration's fault, so it is run once more."""
        job.trial.set_user_attr("failure_class", "worker_lost")
        return self._not_finished(job, TrialState.WORKER_LOST, f"the worker running this trial was lost: "
                                                               f"{exc.__class__.__name__}", "worker_lost")

    def _not_finished(self, job: _InFlight, state: TrialState, message: str,
                      failure_class: str | None = None) -> TrialSummary:
        """Ended by something other than its configuration (a lost worker, a stopped run): nothing measured,
        failed for Optuna (no sampler learns from it), and its configuration queued to run once more, first."""
        trial = job.trial
        self._not_measured(trial, job.config, state, failure_class=failure_class, message=message,
                           started_at=job.started_at)
        self.study.tell(trial, state=OptunaState.FAIL)
        if not trial.user_attrs.get(RERUN_ATTR):
            attrs = {RERUN_ATTR: trial.number, **({BASELINE_ATTR: True} if job.baseline else {})}
            self.study.enqueue_trial(dict(trial.params), user_attrs=attrs, skip_if_exists=False)
        summary = TrialSummary(trial.number, state, job.baseline, job.config, failure_class=failure_class,
                               reason=message)
        self._emit(TrialDone(summary))
        return summary

    def _infeasible(self, trial: optuna.Trial, config: EngineConfig, baseline: bool,
                    violations: list[str]) -> TrialSummary:
        """Rejected before launch: told to Optuna as a trial that breaks a constraint, never launched."""
        predicted = PREDICTED_KV_INSUFFICIENT if any(v.startswith(PREDICTED_KV_INSUFFICIENT)
                                                     for v in violations) else None
        trial.set_user_attr("infeasible", violations)
        trial.set_user_attr("feasible", False)
        if predicted is not None:
            trial.set_user_attr("failure_class", predicted)
        trial.set_constraint("search_space_rules", float(len(violations)))
        self._not_measured(trial, config, TrialState.INFEASIBLE, Rejection(violations), failure_class=predicted,
                           message="; ".join(violations) if predicted else None)
        # Objective values are required with a completed trial; these are the worst possible and marked so.
        trial.set_user_attr("objective_values", "not measured: rejected before launch")
        self.study.tell(trial, [0.0, self.settings.request_timeout_s])
        summary = TrialSummary(trial.number, TrialState.INFEASIBLE, baseline, config, failure_class=predicted,
                               reason="; ".join(violations))
        self._emit(TrialDone(summary))
        return summary

    def _conclude(self, trial: optuna.Trial, config: EngineConfig, baseline: bool, outcome: TrialOutcome,
                  trace: Trace) -> TrialSummary:
        record = outcome.record
        m = record.measurement
        scored: Score | None = None
        failure_class = reason = None
        if record.failure is not None:
            state, failure_class, reason = TrialState.FAILED, record.failure.kind.value, record.failure.message
            trial.set_user_attr("failure_class", failure_class)
            trial.set_user_attr("failure_message", reason[:500])
            if record.failure.estimated_max_model_len is not None:
                trial.set_user_attr("estimated_max_model_len", record.failure.estimated_max_model_len)
        elif record.stop_reason is not None:
            state, reason = TrialState.PRUNED, record.stop_reason
            trial.set_user_attr("prune_reason", reason)
        elif m is None or m.e2e_s.p95 is None:
            state, failure_class, reason = TrialState.FAILED, "no_request_finished", "no request finished"
            trial.set_user_attr("failure_class", failure_class)
        else:
            state = TrialState.COMPLETE
            scored = score(m, self.ctx.boundary, trace.span_s)
            for key, value in scored.constraints.items():
                trial.set_constraint(key, value)
            trial.set_user_attr("feasible", scored.feasible)
            if scored.violations:
                trial.set_user_attr("violations", scored.violations)
        if m is not None:
            for key, value in measurement_attrs(m).items():
                trial.set_user_attr(key, value)
        trial.set_user_attr("startup_s", record.timings.startup_s)
        if KV_PREDICTION_ATTR in trial.user_attrs:
            try:
                logged = logged_kv_tokens(Path(record.log_path).read_text(errors="replace"))
            except OSError:  # no log came back from the worker: nothing to set beside the prediction
                logged = None
            if logged is not None:
                trial.set_user_attr(KV_LOGGED_ATTR, logged)
        stored = StoredTrial.from_record(
            self.settings.name, trial.number, record, state=state, attempt=_attempt(self.study, trial),
            score=scored, prune_reason=record.stop_reason,
            finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        self.repo.save_trial(stored, outcome.requests)
        if scored is not None:
            self.study.tell(trial, list(scored.objectives))
        else:
            self.study.tell(trial, state=OptunaState.PRUNED if state is TrialState.PRUNED else OptunaState.FAIL)
        summary = TrialSummary(trial.number, state, baseline, config, scored, failure_class, reason)
        self._emit(TrialDone(summary))
        return summary


def enqueue_config(name: str, plan: StoragePlan, config: EngineConfig, user_attrs: dict | None = None) -> None:
    """Queue a configuration to be run next, ahead of the sampler (a known good one, or one to check).

    Its searched settings become the trial's parameters; settings the space fixes must agree with it."""
    repo = plan.repository()
    settings = repo.get_study(name)
    space = _stored_space(settings)
    values = config.to_dict()
    for key, fixed in space.fixed.items():
        if key in values and values[key] != fixed:
            raise TunerError(f"{key} is fixed to {fixed!r} in space {space.name}, got {values[key]!r}")
    unknown = sorted(set(values) - set(space.fixed) - set(space.parameters))
    if unknown:
        raise TunerError(f"{unknown[0]} is not searched in space {space.name}: "
                         f"searched are {', '.join(sorted(space.parameters)) or 'none'}")
    load_optuna_study(name, plan).enqueue_trial({k: v for k, v in values.items() if k in space.parameters},
                                                user_attrs=user_attrs, skip_if_exists=False)


# --- reading a study back ------------------------------------------------------------------------------

# Completed throughput within this share of the best counts as a tie, settled by the lower p95: in an open
# loop every configuration that keeps up completes at about the offered rate.
THROUGHPUT_TIE = 0.01


@dataclass(frozen=True)
class Recommendation:
    """The configuration a study recommends under its boundary, and vLLM's default one to compare it with."""

    trial: StoredTrial  # feasible: complete and scored
    boundary: Boundary
    baseline: StoredTrial | None  # vLLM's default configuration, as run first

    @property
    def gain(self) -> dict[str, float] | None:
        """Throughput and p95 of the recommendation over the baseline's, when the baseline was scored."""
        base = self.baseline.scored if self.baseline is not None else None
        if base is None or not base.completed_rps:
            return None
        rec = self.trial.scored
        return {"completed_rps_ratio": rec.completed_rps / base.completed_rps,
                "e2e_p95_ratio": rec.e2e_p95_s / base.e2e_p95_s if base.e2e_p95_s else math.nan}


def find_baseline(trials: list[StoredTrial], optuna_study: optuna.Study) -> StoredTrial | None:
    """vLLM's default configuration as run in the study: its completed run if any, else its first try."""
    numbers = {t.number for t in optuna_study.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR)}
    baselines = [t for t in trials if t.trial_number in numbers]
    return next((t for t in baselines if t.state is TrialState.COMPLETE), baselines[0] if baselines else None)


def recommend(repo: Repository, settings: StudySettings, optuna_study: optuna.Study) -> Recommendation | None:
    """The feasible trial with the highest completed throughput (near-ties to the lower p95 latency)."""
    trials = repo.trials(settings.name)
    feasible = [t for t in trials if t.feasible]
    baseline = find_baseline(trials, optuna_study)
    bound = boundary(settings.boundary, settings.limits)
    if not feasible:
        return None
    top = max(t.scored.completed_rps for t in feasible)
    contenders = [t for t in feasible if t.scored.completed_rps >= top * (1 - THROUGHPUT_TIE)]
    best = min(contenders, key=lambda t: (t.scored.e2e_p95_s, -t.scored.completed_rps))
    return Recommendation(best, bound, baseline)


def load_optuna_study(name: str, plan: StoragePlan) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=plan.optuna_storage())
    except KeyError:
        raise NotFound(f"no study named {name}") from None


# --- warm start: a new study begins where an earlier one got to ----------------------------------------

WARM_START_LIMIT = 4  # the best few configurations are carried over, not the whole earlier study


def latest_trace(folder: str | Path) -> Path:
    """The most recently modified file in `folder`, hidden files aside (a tie goes to the later name)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TunerError(f"{folder} is not a folder")
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    if not files:
        raise TunerError(f"no trace file in {folder}")
    return max(files, key=lambda p: (p.stat().st_mtime, p.name))


@dataclass(frozen=True)
class WarmStart:
    source: str  # the earlier study
    trials: list[int]  # its trials whose configurations were queued, best first
    configs: list[EngineConfig]
    skipped: list[str]  # configurations that the new study's space refuses, and why

    def to_dict(self) -> dict:
        return {"from": self.source, "trials": self.trials, "configs": [c.to_dict() for c in self.configs],
                "skipped": self.skipped}


def previous_study(repo: Repository, settings: StudySettings, plan: StoragePlan) -> StudySettings | None:
    """The most recent study created before this one on the same model and the same search space that found a
    configuration meeting its boundary."""
    same = (settings.model, settings.space_name, settings.space_text)
    for earlier in reversed(repo.list_studies()):
        if (earlier.name != settings.name and earlier.created_at <= settings.created_at
                and (earlier.model, earlier.space_name, earlier.space_text) == same
                and recommend(repo, earlier, load_optuna_study(earlier.name, plan)) is not None):
            return earlier
    return None


def best_trials(repo: Repository, settings: StudySettings, optuna_study: optuna.Study) -> list[StoredTrial]:
    """The feasible trials, the recommendation first and then by completed throughput."""
    rec = recommend(repo, settings, optuna_study)
    if rec is None:
        return []
    others = [t for t in repo.trials(settings.name) if t.feasible and t.trial_number != rec.trial.trial_number]
    return [rec.trial, *sorted(others, key=lambda t: -t.scored.completed_rps)]


def warm_start(name: str, plan: StoragePlan, source: str | None = None) -> WarmStart | None:
    """Queue the best configurations of an earlier study (`source`, else `previous_study`) to run right after
    the baseline, ahead of the sampler; None when there is no such study.

    vLLM's default configuration is left out (every study runs it first anyway), and so are repeats."""
    repo = plan.repository()
    settings = repo.get_study(name)
    earlier = repo.get_study(source) if source is not None else previous_study(repo, settings, plan)
    if earlier is None:
        return None
    space = _stored_space(settings)
    chosen: list[tuple[int, EngineConfig]] = []
    skipped: list[str] = []
    seen: set[tuple] = set()
    for trial in best_trials(repo, earlier, load_optuna_study(earlier.name, plan)):
        config = trial.engine_config
        searched = tuple(sorted((k, v) for k, v in config.to_dict().items() if k in space.parameters))
        if not searched or searched in seen:
            continue
        seen.add(searched)
        origin = {WARM_START_ATTR: f"{earlier.name} trial {trial.trial_number}"}
        try:
            enqueue_config(name, plan, config, user_attrs=origin)
        except TunerError as exc:
            skipped.append(f"trial {trial.trial_number}: {exc}")
            continue
        chosen.append((trial.trial_number, config))
        if len(chosen) == WARM_START_LIMIT:
            break
    warm = WarmStart(earlier.name, [n for n, _ in chosen], [c for _, c in chosen], skipped)
    load_optuna_study(name, plan).set_user_attr("warm_start", warm.to_dict())
    return warm
