"""How each trial of a run ends in the records: scored and stored, or stored as not measured, told to Optuna
either way, and, where its configuration was not at fault, queued to run again."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from tuner.search.bottleneck import measurement_attrs
from tuner.analysis.capacity import JudgedProbe, capacity_of
from tuner.analysis.diagnosis import LIMITING_RESOURCE_ATTR, EngineCaps, limiting_resource
from tuner.common.hardware import detect_hardware
from tuner.analysis.kv_budget import logged_kv_tokens
from tuner.analysis.scoring import Boundary, Rejection, Score, score
from tuner.search_spaces import PREDICTED_KV_INSUFFICIENT
from tuner.storage import StoredTrial, TrialState
from tuner.storage.artifacts import attach_trial_artifacts
from tuner.study.attrs import BASELINE_ATTR, KV_LOGGED_ATTR, KV_PREDICTION_ATTR, RERUN_ATTR, RESUMED_ATTR, \
    VALIDATION_ATTR
from tuner.study.events import RunEvent, TrialDone, TrialSummary
from tuner.study.heartbeat import Heartbeat
from tuner.study.open_study import OpenStudy, kept_attrs, mark_of
from tuner.traces.records import Trace
from tuner.workers.engine_config import EngineConfig
from tuner.workers.pool import WorkerResult
from tuner.workers.trial import ARTIFACTS, TrialOutcome, TrialRecord


@dataclass
class InFlight:
    """A trial launched on a slot and not ended yet: what its end is recorded with."""

    trial: optuna.Trial
    config: EngineConfig
    baseline: bool
    trace: Trace
    slot: int
    beat: Heartbeat
    started_at: str  # ISO 8601, UTC
    # The best capacity so far when it started, (against the reference load, req/s): its search tries that first.
    best_capacity: tuple[float | None, float | None] = (None, None)
    slot_freed_at: float | None = None  # when the trial before it on this slot ended (time.time())


class TrialLedger:
    """Records each trial's end in the project's tables and Optuna, and says it (`TrialDone`)."""

    def __init__(self, opened: OpenStudy, emit: Callable[[RunEvent], None]):
        self.opened, self._emit = opened, emit

    def finish(self, job: InFlight, result: WorkerResult) -> TrialSummary:
        """Bring the worker's files into the driver's artifact store, then score, store and tell."""
        out_dir = self.opened.trial_dir(job.trial.number)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in result.files.items():
            (out_dir / name).write_bytes(data)
        record = dataclasses.replace(result.outcome.record, log_path=str(out_dir / "server.log"))
        outcome = dataclasses.replace(result.outcome, record=record)
        attach_trial_artifacts(self.opened.study, job.trial, [out_dir / name for name in ARTIFACTS],
                               self.opened.plan.artifact_dir)
        return self._conclude(job, outcome)

    def not_measured(self, trial: optuna.Trial | FrozenTrial, config: EngineConfig, state: TrialState,
                     rejection: Rejection | None = None, failure_class: str | None = None,
                     message: str | None = None, started_at: str | None = None) -> None:
        """Store a trial that ended with no measurement: rejected before launch, stopped, its worker or driver lost."""
        settings = self.opened.settings
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.opened.repo.save_trial(StoredTrial(
            study_name=settings.name, trial_number=trial.number, attempt=self.opened.attempt(trial),
            state=state, engine_config=config, serve_command=config.serve_command(settings.model),
            measurement=None, failure_class=failure_class, failure_message=message, log_excerpt=None,
            estimated_max_model_len=None, exit_code=None, timings=None, hardware=detect_hardware(),
            vllm_version="", started_at=started_at or now, finished_at=now, score=rejection, prune_reason=None,
            validation=mark_of(trial)), [])

    def record_interrupted(self) -> None:
        """Trials whose driver died mid-trial (failed by their stale heartbeat) into the project's tables, so that
        export and reports hold every trial; their configurations run again from the queue."""
        recorded = {t.trial_number for t in self.opened.trials()}
        for frozen in self.opened.study.get_trials(deepcopy=False, states=(OptunaState.FAIL,)):
            if frozen.number in recorded or "engine_config" not in frozen.user_attrs:
                continue
            config = EngineConfig.from_dict(frozen.user_attrs["engine_config"])
            self.not_measured(frozen, config, TrialState.INTERRUPTED, message="its driver stopped before the "
                              "trial finished (no heartbeat); the configuration is run again")

    def lost(self, job: InFlight, exc: Exception) -> TrialSummary:
        """The worker (or its node) died mid-trial: not the configuration's fault, so it is run once more."""
        job.trial.set_user_attr("failure_class", "worker_lost")
        return self.not_finished(job, TrialState.WORKER_LOST, f"the worker running this trial was lost: "
                                                              f"{exc.__class__.__name__}", "worker_lost")

    def not_finished(self, job: InFlight, state: TrialState, message: str,
                     failure_class: str | None = None) -> TrialSummary:
        """Ended by something other than its configuration (a lost worker, a stopped run): nothing measured,
        failed for Optuna (no sampler learns from it), and its configuration queued to run once more, first; a
        re-run is queued again only if it finished probes of its own, which the next goes on after."""
        trial, study = job.trial, self.opened.study
        self.not_measured(trial, job.config, state, failure_class=failure_class, message=message,
                          started_at=job.started_at)
        study.tell(trial, state=OptunaState.FAIL)
        if self.opened.probe_log(trial.number).runs_again(rerun=self.opened.rerun_of(trial) is not None):
            attrs = {RERUN_ATTR: trial.number, **kept_attrs(trial),
                     **{k: trial.user_attrs[k] for k in (BASELINE_ATTR, VALIDATION_ATTR) if k in trial.user_attrs}}
            study.enqueue_trial(dict(trial.params), user_attrs=attrs, skip_if_exists=False)
        return self._done(TrialSummary(trial.number, state, job.baseline, job.config, failure_class=failure_class,
                                       reason=message, validation=mark_of(trial)))

    def infeasible(self, trial: optuna.Trial, config: EngineConfig, baseline: bool,
                   violations: list[str]) -> TrialSummary:
        """Rejected before launch: told to Optuna as a trial that breaks a constraint, never launched."""
        predicted = PREDICTED_KV_INSUFFICIENT if any(v.startswith(PREDICTED_KV_INSUFFICIENT)
                                                     for v in violations) else None
        trial.set_user_attr("infeasible", violations)
        trial.set_user_attr("feasible", False)
        if predicted is not None:
            trial.set_user_attr("failure_class", predicted)
        trial.set_constraint("search_space_rules", float(len(violations)))
        self.not_measured(trial, config, TrialState.INFEASIBLE, Rejection(violations), failure_class=predicted,
                          message="; ".join(violations) if predicted else None)
        # Objective values are required with a completed trial; these are the worst possible and marked so.
        trial.set_user_attr("objective_values", "not measured: rejected before launch")
        self.opened.study.tell(trial, [0.0, self.opened.settings.request_timeout_s])
        return self._done(TrialSummary(trial.number, TrialState.INFEASIBLE, baseline, config,
                                       failure_class=predicted, reason="; ".join(violations),
                                       validation=mark_of(trial)))

    def _conclude(self, job: InFlight, outcome: TrialOutcome) -> TrialSummary:
        """Judge a launch's probes, score it if it served, store it and tell Optuna."""
        trial, record, settings, ctx = job.trial, outcome.record, self.opened.settings, self.opened.ctx
        m = record.measurement
        scored: Score | None = None
        failure_class = reason = None
        judged = [JudgedProbe.of(run, ctx.boundary) for run in outcome.probes] \
            if settings.load.mode == "search" else []
        capacity = None
        if judged:
            capacity = capacity_of(judged, settings.load.for_launch(mark_of(trial) is not None),
                                   ctx.selection.rate_scale or 1.0, *job.best_capacity)
            trial.set_user_attr("capacity_rps", capacity.rps)
            trial.set_user_attr("capacity_search", capacity.ended)
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
            scored = score(m, ctx.boundary, job.trace.span_s, capacity, judge_pace=bool(judged),
                           whole_share=job.trace.whole_share)
            for key, value in scored.constraints.items():
                trial.set_constraint(key, value)
            trial.set_user_attr("feasible", scored.feasible)
            if scored.violations:
                trial.set_user_attr("violations", scored.violations)
        _set_measured_attrs(trial, job.config, record, judged, ctx.boundary)
        stored = StoredTrial.from_record(
            settings.name, trial.number, record, state=state, attempt=self.opened.attempt(trial),
            score=scored, prune_reason=record.stop_reason,
            finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), probes=judged,
            validation=mark_of(trial))
        self.opened.repo.save_trial(stored, outcome.requests)
        if scored is not None:
            self.opened.study.tell(trial, list(scored.objectives))
        else:
            self.opened.study.tell(trial, state=OptunaState.PRUNED if state is TrialState.PRUNED else OptunaState.FAIL)
        return self._done(TrialSummary(trial.number, state, job.baseline, job.config, scored, failure_class, reason,
                                       mark_of(trial)))

    def _done(self, summary: TrialSummary) -> TrialSummary:
        self._emit(TrialDone(summary))
        return summary


def _set_measured_attrs(trial: optuna.Trial, config: EngineConfig, record: TrialRecord, judged: list[JudgedProbe],
                        bound: Boundary) -> None:
    """What the dashboard shows of a launch beside its score: the measurement's figures, what limited it, its
    startup, compile cache and resumed probes, and the KV cache vLLM logged beside the one predicted."""
    m = record.measurement
    if m is not None:
        for key, value in measurement_attrs(m).items():
            trial.set_user_attr(key, value)
    held_by = limiting_resource(judged, m, EngineCaps.of(config.to_dict(), record.hardware), bound=bound)
    if held_by is not None:  # for the dashboard: the kind, the load, the figures and a sentence
        trial.set_user_attr(LIMITING_RESOURCE_ATTR, held_by.to_dict())
    trial.set_user_attr("startup_s", record.timings.startup_s)
    resumed = [p.earlier_trial for p in record.probes if p.earlier_trial is not None]
    if resumed:
        trial.set_user_attr(RESUMED_ATTR, {"trials": sorted(set(resumed)), "probes": len(resumed)})
    trial.set_user_attr("compile_cache", record.timings.compile_cache.value)
    if KV_PREDICTION_ATTR in trial.user_attrs:
        try:
            logged = logged_kv_tokens(Path(record.log_path).read_text(errors="replace"))
        except OSError:  # no log came back from the worker: nothing to set beside the prediction
            logged = None
        if logged is not None:
            trial.set_user_attr(KV_LOGGED_ATTR, logged)
