"""The tuner as a service: a Ray Serve application whose FastAPI ingress creates, lists and shows studies,
starts and stops runs, reports live status, the best configuration and the report, and hosts the schedules.

Bound to loopback it may run without a token; bound anywhere else it refuses to start without one, and every
request but the health check and the OpenAPI spec must carry it as a bearer token."""

from __future__ import annotations

import hmac
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Optional

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from tuner.answers import Enqueued, PlanAnswer, RecommendationAnswer, ReportAnswer, StudyCreated, StudyListing
from tuner.answers.runs import Health, Removed, RunAnswer, ScheduleAnswer, ScheduleRunWithSummary, StudyWithRuns
from tuner.common.durations import parse_duration
from tuner.common.errors import NotFound, TunerError
from tuner.analysis.replicas import HOURS
from tuner.runs import RunBook, RunRecord
from tuner.schedules import ScheduleBook
from tuner.studies import LocalStudies, NoRecommendation, StudyRequest
from tuner.study.capacity_plan import PlanOptions
from tuner.study.plan import StoragePlan
from tuner.supervisor import STOP_GRACE_S, RunRequest

APP_NAME = "tuner"
BEARER = HTTPBearer(auto_error=False)
# How long the replica may take to stop: its runs' stop wait (they stop together), then their kill and the
# replica's own exit. Serve kills the replica after this (a run still going then gets SIGTERM as it dies).
SHUTDOWN_TIMEOUT_S = STOP_GRACE_S + 30


@dataclass(frozen=True)
class ServiceConfig:
    """What a service process needs: the storage URL and artifact folder (None: the defaults), the API token (None: no
    authentication) and the Ray cluster its runs join (None: a local one). The URL and the token stay out of its
    repr."""

    # Out of the repr, which Ray may log: the URL's password and the token.
    storage: str | None = field(repr=False)
    artifacts: str | None
    token: str | None = field(repr=False)
    ray_address: str | None  # the cluster the service's runs join


class ScheduleRequest(BaseModel):
    """The options of `tuner schedule add`."""

    name: str = Field(min_length=1, max_length=191)
    study: str = Field(min_length=1, max_length=200)
    cron: str = Field(min_length=1, max_length=200, examples=["0 1 * * *"])
    window: str = Field(min_length=1, max_length=50, examples=["5h"], description="How long a run may last: 5h, "
                                                                                  "30m, 90s.")
    trials: Optional[int] = Field(None, ge=1, le=100_000)


class EnqueueRequest(BaseModel):
    """The body of `POST /studies/{name}/enqueue`: the configuration to run next, as engine settings NAME=VALUE."""

    settings: list[str] = Field(min_length=1, description="Engine settings NAME=VALUE, as `tuner study enqueue --set`.")


def _run_answer(record: RunRecord) -> RunAnswer:
    """A run's record as the service answers it."""
    return RunAnswer.model_validate(record.to_dict())


def build_api(studies: LocalStudies, runs: RunBook, schedules: ScheduleBook, token: str | None) -> FastAPI:
    """The HTTP API over the study answers, the run book and the schedule book."""
    api = FastAPI(title="tuner", description="Auto-tuning of vLLM engine settings, measured on your own traffic.",
                  version="1")
    def authorized(credentials: Annotated[Optional[HTTPAuthorizationCredentials], Depends(BEARER)]) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})

    @api.exception_handler(TunerError)
    def tuner_error(request: Request, exc: TunerError) -> JSONResponse:
        if isinstance(exc, NoRecommendation):
            return JSONResponse({"detail": str(exc), "code": "no_recommendation"}, status_code=404)
        return JSONResponse({"detail": str(exc)}, status_code=404 if isinstance(exc, NotFound) else 400)

    @api.get("/healthz", tags=["service"])
    def healthz() -> Health:
        return {"ok": True}

    guarded = [Depends(authorized)]

    @api.get("/studies", tags=["studies"], dependencies=guarded)
    def list_studies() -> list[StudyListing]:
        return studies.list()

    @api.post("/studies", tags=["studies"], status_code=201, dependencies=guarded, response_model_exclude_unset=True)
    def create_study(request: StudyRequest) -> StudyCreated:
        return studies.create(request)

    @api.get("/studies/{name}", tags=["studies"], dependencies=guarded, response_model_exclude_unset=True)
    def study_status(name: str) -> StudyWithRuns:
        return StudyWithRuns(**studies.status(name).to_dict(), runs=[_run_answer(run) for run in runs.list(name)])

    @api.get("/studies/{name}/best", tags=["studies"], dependencies=guarded, response_model_exclude_unset=True)
    def study_best(name: str) -> RecommendationAnswer:
        return studies.best(name)

    @api.post("/studies/{name}/enqueue", tags=["studies"], dependencies=guarded)
    def study_enqueue(name: str, request: EnqueueRequest) -> Enqueued:
        return studies.enqueue(name, request.settings)

    @api.get("/studies/{name}/plan", tags=["studies"], dependencies=guarded, response_model_exclude_unset=True,
             response_model=PlanAnswer)
    def study_plan(name: str, peak: Annotated[Optional[float], Query(description="Peak req/s; default: the trace's "
                                                                                 "busiest window")] = None,
                   peak_window_s: float = 60.0,
                   scale: Annotated[Optional[float], Query(description="The trace's recorded rate times this; "
                                                                       "default: the study's rate scale")] = None,
                   rates: Annotated[Optional[list[float]], Query(description="24 rates, req/s, hour 0 to 23")] = None,
                   gpu_hour_cost: Annotated[Optional[float], Query(description="US dollars per GPU-hour")] = None,
                   headroom: float = 0.8, day: bool = False) -> PlanAnswer:
        if rates is not None and len(rates) != HOURS:
            raise TunerError(f"rates: a day needs 24 rates, hour 0 to 23; got {len(rates)}")
        return studies.capacity_plan(name, PlanOptions(peak, peak_window_s, scale, tuple(rates) if rates else None,
                                              gpu_hour_cost, headroom, day))

    @api.get("/studies/{name}/report", tags=["studies"], dependencies=guarded, response_model_exclude_unset=True)
    def study_report(name: str) -> ReportAnswer:
        return studies.report(name)

    @api.get("/studies/{name}/report.html", tags=["studies"], response_class=HTMLResponse, dependencies=guarded)
    def study_report_html(name: str) -> str:
        return studies.report_html(name)

    @api.get("/studies/{name}/export", tags=["studies"], response_class=PlainTextResponse, dependencies=guarded)
    def study_export(name: str, format: Annotated[str, Query(pattern="^(json|csv)$")] = "json",
                     requests: bool = False) -> str:
        return studies.export(name, format, requests)

    @api.post("/studies/{name}/runs", tags=["runs"], status_code=202, dependencies=guarded)
    def start_run(name: str, request: RunRequest) -> RunAnswer:
        studies.status(name)  # a clear 404 now rather than a failed run later
        if request.timeout_s is not None and request.window_s is not None:
            raise TunerError("give timeout_s or window_s, not both")
        return _run_answer(runs.start(name, request))

    @api.get("/runs", tags=["runs"], dependencies=guarded)
    def list_runs() -> list[RunAnswer]:
        return [_run_answer(run) for run in runs.list()]

    @api.get("/runs/{run_id}", tags=["runs"], dependencies=guarded)
    def run_status(run_id: str) -> RunAnswer:
        return _run_answer(runs.get(run_id))

    @api.post("/runs/{run_id}/stop", tags=["runs"], dependencies=guarded)
    def stop_run(run_id: str) -> RunAnswer:
        return _run_answer(runs.stop(run_id))

    @api.get("/schedules", tags=["schedules"], dependencies=guarded, response_model_exclude_unset=True)
    def list_schedules() -> list[ScheduleAnswer]:
        return [s.to_dict() for s in schedules.list()]

    @api.post("/schedules", tags=["schedules"], status_code=201, dependencies=guarded,
              response_model_exclude_unset=True)
    def add_schedule(request: ScheduleRequest) -> ScheduleAnswer:
        return schedules.add(request.name, study=request.study, cron=request.cron,
                             window_s=parse_duration(request.window), trials=request.trials).to_dict()

    @api.get("/schedules/{name}", tags=["schedules"], dependencies=guarded, response_model_exclude_unset=True)
    def show_schedule(name: str) -> ScheduleAnswer:
        return schedules.get(name).to_dict()

    @api.delete("/schedules/{name}", tags=["schedules"], dependencies=guarded)
    def remove_schedule(name: str) -> Removed:
        schedules.remove(name)
        return {"removed": name}

    @api.post("/schedules/{name}/run-now", tags=["schedules"], dependencies=guarded, response_model_exclude_unset=True)
    def run_schedule_now(name: str) -> ScheduleAnswer:
        return schedules.run_now(name).to_dict()

    @api.get("/schedules/{name}/runs", tags=["schedules"], dependencies=guarded, response_model_exclude_unset=True)
    def schedule_runs(name: str, limit: Annotated[Optional[int], Query(ge=1, le=1000)] = None
                      ) -> list[ScheduleRunWithSummary]:
        """Its runs, the latest first, each with its morning summary (`summary`, in words)."""
        schedules.get(name)
        return [{**run.to_dict(), "summary": run.lines()} for run in schedules.runs(name, limit)]

    return api


def _service_deployment():
    """The Serve deployment, built on demand so that importing this module does not import Ray Serve."""
    # lazy: Ray Serve loads only to host the service; importing its API (`build_api`) does not load it
    from ray import serve

    @serve.deployment(name="tuner-api", num_replicas=1, ray_actor_options={"num_cpus": 0},
                      max_ongoing_requests=64, health_check_period_s=5,
                      graceful_shutdown_timeout_s=SHUTDOWN_TIMEOUT_S)
    @serve.ingress()
    class TunerService:
        """One replica: it holds the runs it started, so there is exactly one."""

        def __init__(self, config: ServiceConfig):
            import ray  # lazy, as Ray Serve above

            self.plan = StoragePlan.resolve(config.storage, config.artifacts)
            # Runs, whether started by a request or a schedule, join the service's cluster.
            os.environ["RAY_ADDRESS"] = config.ray_address or ray.get_runtime_context().gcs_address
            self.runs = RunBook(self.plan)
            self.schedules = ScheduleBook(self.plan)
            self.schedules.start()
            self.token = config.token

        def __serve_build_asgi_app__(self):
            return build_api(LocalStudies(self.plan), self.runs, self.schedules, self.token)

        def __del__(self):
            # The runs and the scheduled runs stop at the same time: together they fit in SHUTDOWN_TIMEOUT_S.
            stopping_schedules = threading.Thread(target=self.schedules.shutdown)
            stopping_schedules.start()
            self.runs.stop_all()
            stopping_schedules.join()

    return TunerService


def host_service(config: ServiceConfig, host: str, port: int, stop: threading.Event,
                 on_ready: Callable[[], None], on_stopping: Callable[[], None]) -> None:
    """Host the service on Ray Serve at host:port (joining config.ray_address, else starting a local Ray) until
    `stop` is set; `on_ready` is called once it answers, `on_stopping` as it begins to stop. On the way out its
    runs are stopped (given SHUTDOWN_TIMEOUT_S) before Ray is shut down, whatever ended it."""
    # lazy: Ray loads only to host the service; importing its API (`build_api`, as its tests do) does not load it
    import ray
    from ray import serve

    from tuner.workers.pool import connect_ray

    # A replica that exits (Serve replaces one whose health check timed out on a busy machine) would have Ray
    # SIGKILL the runs it started, which then record nothing. Left alone, a run is told by SIGTERM as its
    # replica's thread ends (tied_to_this_thread) and stops its trials properly. For the local cluster started here;
    # a cluster of its own (`ray start`) takes the same variable from its environment.
    os.environ.setdefault("RAY_kill_child_processes_on_worker_exit", "false")
    connect_ray(config.ray_address, num_cpus=os.cpu_count())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(_service_deployment().bind(config), name=APP_NAME, route_prefix="/", blocking=False)
    except BaseException as exc:
        ray.shutdown()
        # Serve's proxy raises a RuntimeError (in a Ray task error) for an address taken after `tuner serve` checked it
        if isinstance(exc, RuntimeError) and "Failed to bind to address" in str(exc):
            raise TunerError(f"cannot serve on {host}:{port}: Address already in use") from None
        raise
    on_ready()
    try:
        stop.wait()
    finally:
        on_stopping()
        # The replica may take SHUTDOWN_TIMEOUT_S to stop its runs, longer than serve.shutdown waits (30 s)
        # before ray.shutdown would take the cluster down under the runs still stopping.
        serve.delete(APP_NAME, _blocking=False)
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S + 10
        while APP_NAME in serve.status().applications and time.monotonic() < deadline:
            time.sleep(0.5)
        serve.shutdown()
        ray.shutdown()
