"""What each study command answers, as JSON-ready data: the same answers whether the command line runs them
here (`LocalStudies`) or asks a tuner service for them (`tuner.service.client.RemoteStudies`), so both print
alike (their models are in `tuner.answers`). The service itself answers with `LocalStudies`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from optuna.trial import TrialState
from pydantic import BaseModel, Field

from tuner.analysis.capacity import LoadPolicy
from tuner.describe import RecommendationContext, baseline_dict, recommendation_dict
from tuner.common.errors import TunerError
from tuner.common.models import default_model
from tuner.common.paths import bundled_trace
from tuner.analysis.scoring import boundary, parse_limits
from tuner.storage import StoredTrial
from tuner.storage.spend import GpuTime, Spend
from tuner.storage.urls import redact_url
from tuner.study.capacity_plan import CAPACITY_PLAN_ATTR, plan_capacity
from tuner.study.plan import load_optuna_study
from tuner.study.recommendation import find_baseline, recommend, trial_limit
from tuner.answers import (Enqueued, PlanAnswer, RecommendationAnswer, ReportAnswer, StudyCreated, StudyListing,
                           StudyStatus)
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
    # tuner.search.samplers.DEFAULT_SAMPLER; that module imports Optuna, this one stays light
    sampler: str = "bottleneck"
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
