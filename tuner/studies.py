"""What each study command answers, as JSON-ready data: the same answers whether the command line runs them
here (`LocalStudies`) or asks a tuner service for them (`tuner.service_client.RemoteStudies`), so both print
alike. The service itself answers with `LocalStudies`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tuner.describe import recommendation_context, recommendation_dict
from tuner.errors import TunerError


class NoRecommendation(TunerError):
    """No trial of the study met its boundary yet (the command exits 1: an answer, not bad usage)."""


class StudyRequest(BaseModel):
    """A study to create: the options of `tuner study create`. Paths are read where the study is created."""

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
    sampler: str = "bottleneck"  # tuner.samplers.DEFAULT_SAMPLER; that module imports Optuna, this one stays light
    seed: Optional[int] = None
    request_timeout_s: float = 600.0
    startup_timeout_s: float = 600.0


# The answers' shapes, declared for the service's OpenAPI document. An answer may carry more than is declared
# (extra="allow"); numbers are kept as given (an int stays an int in the JSON).
Number = float | int
JsonObject = dict[str, Any]


class Answer(BaseModel):
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


class StudyCreated(Answer):
    """The study's settings as stored, where it is stored, and its warm start when one was asked for."""

    name: str
    created_at: str
    model: str
    model_info: JsonObject
    trace_path: str
    trace_sha256: str
    trace_selection: JsonObject
    boundary: str
    limits: dict[str, Optional[Number]]
    space_name: str
    space_text: str
    sampler: str
    seed: Optional[int]
    request_timeout_s: Number
    startup_timeout_s: Number
    extra: JsonObject
    storage: str
    warm_start: Optional[WarmStartAnswer] = Field(None, description="Only when a warm start was asked for.")


class StatedContext(Answer):
    """What every stated recommendation carries: its boundary, the machine, vLLM and the trace."""

    boundary: JsonObject
    boundary_text: str
    hardware: JsonObject
    measured_on: str
    vllm_version: str
    trace: JsonObject


class TrialScore(Answer):
    trial: int
    completed_rps: Number
    e2e_p95_s: Number
    output_tps: Number
    completion_ratio: Number
    constraints: dict[str, Number]
    violations: list[str]
    feasible: bool
    serve_command: str


# Pydantic orders fields from the last base to the first, then the class's own: the keys come out in the order
# the answers have always had.
class BestSoFar(StatedContext, TrialScore):
    """The recommendation so far, with its score."""


class StudyStatus(Answer):
    """Trials by state, the trials in flight and waiting, and the best so far."""

    name: str
    boundary: str
    trials: int
    by_state: dict[str, int]
    running: list[int]
    waiting: list[int]
    best: Optional[BestSoFar]


class RecommendedConfig(Answer):
    study: str
    trial: int
    serve_command: str
    engine_config: JsonObject


class RecommendationAnswer(StatedContext, RecommendedConfig):
    """The recommended configuration: its command, boundary, machine, vLLM, trace, and gain over vLLM's default."""

    score: JsonObject
    measurement: JsonObject
    baseline: Optional[JsonObject]
    gain: Optional[dict[str, Number]]


class Enqueued(Answer):
    study: str
    engine_config: JsonObject


class ReportAnswer(Answer):
    """The report's text parts and its summary (what `tuner study report --json` prints)."""

    summary: JsonObject
    recommended: bool
    lines: list[str]
    side_by_side: list[list[str]]
    baseline_trial: Optional[int]
    recommended_trial: Optional[int]
    common_settings: JsonObject
    trial_rows: list[JsonObject]


class Studies(Protocol):
    """The study commands' answers, the same whether read here or asked of a service."""

    def create(self, request: StudyRequest) -> StudyCreated: ...
    def list(self) -> list[StudyListing]: ...
    def status(self, name: str) -> StudyStatus: ...
    def best(self, name: str) -> RecommendationAnswer: ...
    def enqueue(self, name: str, assignments: list[str]) -> Enqueued: ...
    def export(self, name: str, format: str, requests: bool) -> str: ...
    def report(self, name: str) -> ReportAnswer: ...
    def report_html(self, name: str) -> str: ...


EXPORT_FORMATS = ("json", "csv")
CSV_FIELDS = ["trial_number", "attempt", "state", "pareto", "failure_class", "completed", "requests",
              "completed_rps", "output_tps", "ttft_p95_s", "e2e_p95_s", "preemptions", "feasible", "serve_command"]


class LocalStudies:
    """Answers from the storage itself."""

    def __init__(self, plan):
        self.plan = plan

    def _open(self, name: str):
        from tuner.study.plan import load_optuna_study

        repo = self.plan.repository()
        return repo, repo.get_study(name), load_optuna_study(name, self.plan)

    def create(self, request: StudyRequest) -> StudyCreated:
        from tuner.storage.urls import redact_url
        from tuner.models import default_model
        from tuner.traces.selection import TraceSelection
        from tuner.paths import bundled_trace
        from tuner.scoring import parse_limits
        from tuner.study.create import create_study, latest_trace
        from tuner.study.warm_start import warm_start

        if request.trace and request.trace_latest:
            raise TunerError("give a trace or a folder to take the latest trace from, not both")
        trace = latest_trace(Path(request.trace_latest)) if request.trace_latest else request.trace
        if request.warm_from is not None:
            self.plan.repository().get_study(request.warm_from)  # before anything is created
        settings = create_study(
            request.name, model=request.model or default_model(), trace_path=trace or bundled_trace(),
            selection=TraceSelection.from_options(request.window, request.max_requests, request.rate_scale,
                                                  request.fit),
            space=request.space, boundary_name=request.boundary, limits=parse_limits(request.limits),
            plan=self.plan, sampler=request.sampler, seed=request.seed,
            request_timeout_s=request.request_timeout_s, startup_timeout_s=request.startup_timeout_s)
        created = {**settings.to_dict(), "storage": redact_url(self.plan.url)}
        if request.warm_from is not None or request.trace_latest is not None:
            carried = warm_start(request.name, self.plan, request.warm_from)
            created["warm_start"] = carried.to_dict() if carried else None
        return StudyCreated.model_validate(created)

    def list(self) -> list[StudyListing]:
        repo = self.plan.repository()
        rows = []
        for s in repo.list_studies():
            trials = repo.trials(s.name)
            rows.append(StudyListing(name=s.name, created_at=s.created_at, boundary=s.boundary, space=s.space_name,
                                     trace=Path(s.trace_path).name, trials=len(trials),
                                     feasible=sum(t.feasible for t in trials)))
        return rows

    def status(self, name: str) -> StudyStatus:
        from optuna.trial import TrialState

        from tuner.study.recommendation import recommend

        repo, settings, study = self._open(name)
        stored = repo.trials(name)
        states: dict[str, int] = {}
        for t in stored:
            states[t.state] = states.get(t.state, 0) + 1
        running = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        waiting = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
        rec = recommend(repo, settings, study)
        return StudyStatus.model_validate({
            "name": name, "boundary": settings.boundary, "trials": len(stored), "by_state": states,
            "running": running, "waiting": waiting,
            "best": {"trial": rec.trial.trial_number, **rec.trial.scored.to_dict(),
                     "serve_command": rec.trial.serve_command, **recommendation_context(rec, settings)}
            if rec else None})

    def best(self, name: str) -> RecommendationAnswer:
        from tuner.study.recommendation import recommend

        repo, settings, study = self._open(name)
        rec = recommend(repo, settings, study)
        if rec is None:
            raise NoRecommendation(f"study {name}: no trial met the {settings.boundary} boundary yet")
        return RecommendationAnswer.model_validate(recommendation_dict(rec, settings))

    def enqueue(self, name: str, assignments: list[str]) -> Enqueued:
        from tuner.study.create import enqueue_config
        from tuner.workers.engine_config import EngineConfig

        config = EngineConfig.from_assignments(assignments)
        enqueue_config(name, self.plan, config)
        return Enqueued(study=name, engine_config=config.to_dict())

    def export(self, name: str, format: str, requests: bool) -> str:
        from tuner.study.recommendation import recommend

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
                               "trials": rows}, indent=2, default=str) + "\n"
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for t in trials:
            m = t.measurement
            measured = {"completed": m.completed, "requests": m.requests, "completed_rps": m.completed_rps,
                        "output_tps": m.output_tps, "ttft_p95_s": m.ttft_s.p95, "e2e_p95_s": m.e2e_s.p95,
                        "preemptions": m.preemptions} if m else {}
            writer.writerow({"trial_number": t.trial_number, "attempt": t.attempt, "state": t.state.value,
                             "pareto": t.trial_number in pareto, "failure_class": t.failure_class, **measured,
                             "feasible": t.score.feasible if t.score else None, "serve_command": t.serve_command})
        return buffer.getvalue()

    def report(self, name: str) -> ReportAnswer:
        """The report's text parts and its summary; `report_html` is the page with the plots."""
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
        from tuner.report import collect_report, render_html

        return render_html(collect_report(name, self.plan))
