"""The study commands' answers asked of a tuner service over HTTP (`--server URL`): the same answers as
`LocalStudies` gives, so the command line prints the same either way."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from tuner.common.api_token import read_token
from tuner.common.errors import NotFound, TunerError
from tuner.runs import RunRecord
from tuner.answers import (Enqueued, PlanAnswer, RecommendationAnswer, ReportAnswer, StudyCreated, StudyListing,
                           StudyStatus)
from tuner.studies import NoRecommendation, StudyRequest
from tuner.supervisor import RunRequest

if TYPE_CHECKING:
    from tuner.study.capacity_plan import PlanOptions


class ServiceClient:
    """HTTP calls to the service, each failure turned into the error a user can act on."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 120.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        """Send one request to the service; its response when the status is below 400. Raises TunerError when the
        service cannot be reached, refuses the token (401), fails (5xx) or refuses the request (any other 4xx, with the
        service's own detail); NotFound, or NoRecommendation, for a 404."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TunerError(f"cannot reach the tuner service at {self.url}: {exc}") from None
        if response.status_code < 400:
            return response
        try:
            body = response.json()
        except ValueError:
            body = {}
        detail = body.get("detail") if isinstance(body, dict) else None
        if not isinstance(detail, str):  # FastAPI's validation errors are a list
            detail = f"{response.status_code} {response.reason_phrase}: {detail or response.text[:300]}"
        if response.status_code == 401:
            raise TunerError(f"the tuner service at {self.url} refused the request: {detail} "
                             f"(set TUNER_API_TOKEN or give --token-file)")
        if response.status_code == 404:
            raise (NoRecommendation if body.get("code") == "no_recommendation" else NotFound)(detail)
        if response.status_code >= 500:
            raise TunerError(f"the tuner service at {self.url} failed: {detail}")
        raise TunerError(detail)

    def json(self, method: str, path: str, **kwargs):
        """`call`, its response body parsed from JSON."""
        return self.call(method, path, **kwargs).json()


class RemoteStudies:
    """`tuner.studies.Studies`, answered by the service: each method keeps the protocol's promise, and fails as
    `ServiceClient.call` does. Runs, too: started on the service, then followed by polling."""

    def __init__(self, client: ServiceClient):
        self.client = client

    def create(self, request: StudyRequest) -> StudyCreated:
        """`Studies.create` through `POST /studies`."""
        return StudyCreated.model_validate(self.client.json("POST", "/studies", json=request.model_dump()))

    def list(self) -> list[StudyListing]:
        """`Studies.list` through `GET /studies`."""
        return [StudyListing.model_validate(row) for row in self.client.json("GET", "/studies")]

    def status(self, name: str) -> StudyStatus:
        """`Studies.status` through `GET /studies/{name}`, less the service's own list of runs."""
        data = self.client.json("GET", f"/studies/{_quote(name)}")
        data.pop("runs", None)
        return StudyStatus.model_validate(data)

    def best(self, name: str) -> RecommendationAnswer:
        """`Studies.best` through `GET /studies/{name}/best`."""
        return RecommendationAnswer.model_validate(self.client.json("GET", f"/studies/{_quote(name)}/best"))

    def enqueue(self, name: str, assignments: list[str]) -> Enqueued:
        """`Studies.enqueue` through `POST /studies/{name}/enqueue`."""
        return Enqueued.model_validate(self.client.json("POST", f"/studies/{_quote(name)}/enqueue",
                                                        json={"settings": assignments}))

    def export(self, name: str, format: str, requests: bool) -> str:
        """`Studies.export` through `GET /studies/{name}/export`."""
        return self.client.call("GET", f"/studies/{_quote(name)}/export",
                                params={"format": format, "requests": requests}).text

    def capacity_plan(self, name: str, options: PlanOptions) -> PlanAnswer:
        """`Studies.capacity_plan` through `GET /studies/{name}/plan`."""
        params = {"peak": options.peak_rps, "peak_window_s": options.peak_window_s, "scale": options.scale,
                  "rates": list(options.hourly_rps) if options.hourly_rps else None,
                  "gpu_hour_cost": options.gpu_hour_usd, "headroom": options.headroom, "day": options.day}
        return PlanAnswer.model_validate(self.client.json(
            "GET", f"/studies/{_quote(name)}/plan", params={k: v for k, v in params.items() if v is not None}))

    def report(self, name: str) -> ReportAnswer:
        """`Studies.report` through `GET /studies/{name}/report`."""
        return ReportAnswer.model_validate(self.client.json("GET", f"/studies/{_quote(name)}/report"))

    def report_html(self, name: str) -> str:
        """`Studies.report_html` through `GET /studies/{name}/report.html`."""
        return self.client.call("GET", f"/studies/{_quote(name)}/report.html").text

    # Runs: started on the service, followed by polling.

    def start_run(self, name: str, request: RunRequest) -> RunRecord:
        """Start `tuner study run` on the service with the request's options; the new run's record."""
        return RunRecord.from_dict(self.client.json("POST", f"/studies/{_quote(name)}/runs",
                                                    json=request.model_dump(by_alias=True)))

    def run(self, run_id: str) -> RunRecord:
        """The run's record as it stands now; NotFound for an id the service does not know."""
        return RunRecord.from_dict(self.client.json("GET", f"/runs/{_quote(run_id)}"))

    def stop_run(self, run_id: str) -> RunRecord:
        """Ask the service to stop the run as Ctrl-C would; its record. NotFound for an unknown id."""
        return RunRecord.from_dict(self.client.json("POST", f"/runs/{_quote(run_id)}/stop"))


def _quote(segment: str) -> str:
    return quote(segment, safe="")


def remote_studies(server: str, token_file: Path | None) -> RemoteStudies:
    """The study answers of the service at `server`, sent with the API token that `read_token` finds (the file, else
    TUNER_API_TOKEN); TunerError if a token file cannot be read or is empty."""
    return RemoteStudies(ServiceClient(server, read_token(token_file)))
