"""The tuner service for real: `tuner serve` on Ray Serve, bound off loopback with a bearer token; the study
commands through `--server`; two real trials run by the service; best and report over HTTP; schemathesis
against the OpenAPI spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from conftest import AZURE_CONV, run_tuner as tuner
from workers.launch import free_port

pytestmark = pytest.mark.vllm

TOKEN = "test-token-5f0c"


def start_service(root: Path, port: int, *, host: str = "0.0.0.0", token: str | None = TOKEN,
                  storage: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_API_TOKEN", "TUNER_API_TOKEN_FILE")}
    if token:
        env["TUNER_API_TOKEN"] = token
    log = open(root / f"service-{port}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "tuner", "serve", "--host", host, "--port", str(port),
                             "--storage", storage or f"sqlite:///{root / 'tuner.db'}",
                             "--artifacts", str(root / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the service exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("the service never became healthy")


def stop_service(proc: subprocess.Popen) -> int:
    proc.send_signal(2)
    return proc.wait(90)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("service")
    port = free_port()
    proc = start_service(root, port)
    url = f"http://127.0.0.1:{port}"
    current = {"root": root, "url": url, "proc": proc,
               "http": httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)}
    try:
        wait_ready(proc, url)
        yield current
    finally:
        assert stop_service(current["proc"]) == 0  # the restart test replaces it


def remote(service, *args: str, token: str | None = TOKEN, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNER_API_TOKEN": token or ""}
    result = subprocess.run([sys.executable, "-m", "tuner", *args, "--server", service["url"]], capture_output=True,
                            text=True, timeout=900, env=env)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_off_loopback_without_a_token_the_service_refuses_to_start(tmp_path):
    port = free_port()
    assert start_service(tmp_path, port, token=None).wait(60) == 2
    log = (tmp_path / f"service-{port}.log").read_text()
    assert "refusing to serve on 0.0.0.0 without a token" in log and "Traceback" not in log


def test_requests_without_the_token_are_refused_and_with_it_accepted(service):
    url = service["url"]
    assert httpx.get(f"{url}/studies").status_code == 401
    assert httpx.get(f"{url}/studies", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{url}/studies", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert service["http"].get("/studies").status_code == 200
    # The health check and the spec are open: they say nothing about studies.
    assert httpx.get(f"{url}/healthz").json() == {"ok": True}
    spec = httpx.get(f"{url}/openapi.json").json()
    assert {"/studies", "/studies/{name}/runs", "/runs/{run_id}/stop"} <= set(spec["paths"])
    refused = remote(service, "study", "list", token="wrong", check=False)
    assert refused.returncode == 2 and "refused the request" in refused.stderr and "Traceback" not in refused.stderr


@pytest.fixture(scope="module")
def served_study(service, tiny_model):
    """A study created and run for two real trials through the command line's --server."""
    created = json.loads(remote(service, "study", "create", "svc", "--model", str(tiny_model), "--trace",
                                str(AZURE_CONV), "--window", "300:400", "--max-requests", "8", "--rate-scale", "100",
                                "--fit", "clip", "--seed", "1", "--json",
                                # Limits a busy 2-core machine meets: this test is about the service, not speed.
                                "--limit", "ttft_p95_s=60", "--limit", "e2e_p95_s=120").stdout)
    run = remote(service, "study", "run", "svc", "--trials", "2")
    return {"created": created, "run_stderr": run.stderr, "run_stdout": run.stdout}


def test_a_study_created_and_run_through_the_service_runs_two_real_trials(service, served_study):
    assert served_study["created"]["name"] == "svc" and served_study["created"]["storage"].startswith("sqlite:///")
    lines = [line for line in served_study["run_stderr"].splitlines() if line.startswith("trial ")]
    assert len(lines) == 2 and lines[0].startswith("trial 0 (baseline): complete")
    status = service["http"].get("/studies/svc").json()
    assert status["trials"] == 2 and status["by_state"] == {"complete": 2} and status["running"] == []
    (run,) = status["runs"]
    assert run["state"] == "finished" and run["progress"] == {"done": 2, "of": 2}
    assert [t["number"] for t in run["result"]["trials"]] == [0, 1]


def test_best_and_report_over_http_match_the_command_line_here(service, served_study):
    http = service["http"]
    best = http.get("/studies/svc/best").json()
    assert best["serve_command"].startswith("vllm serve ") and best["measurement"]["completed"] == 8
    assert best["boundary"]["name"] == "interactive" and best["measured_on"].startswith("CPU")
    report = http.get("/studies/svc/report").json()
    assert report["summary"]["recommendation"]["trial"] == best["trial"] and len(report["trial_rows"]) == 2
    page = http.get("/studies/svc/report.html")
    assert page.headers["content-type"].startswith("text/html") and "Pareto" in page.text
    # The same answers as the command line gives when it reads the storage itself.
    local = ["--storage", f"sqlite:///{service['root'] / 'tuner.db'}", "--artifacts",
             str(service["root"] / "artifacts")]
    assert json.loads(tuner("study", "best", "svc", "--json", *local).stdout) == best
    assert remote(service, "study", "best", "svc").stdout == tuner("study", "best", "svc", *local).stdout
    assert remote(service, "study", "status", "svc").stdout == tuner("study", "status", "svc", *local).stdout
    assert remote(service, "study", "export", "svc", "--format", "csv").stdout == \
        tuner("study", "export", "svc", "--format", "csv", *local).stdout
    missing = remote(service, "study", "best", "nope", check=False)
    assert missing.returncode == 2 and missing.stderr.strip() == "error: no study named nope"


def test_a_run_stopped_through_the_service_leaves_no_engine(service, served_study):
    http = service["http"]
    run = http.post("/studies/svc/runs", json={"trials": 3}).json()
    deadline = time.monotonic() + 240
    while not http.get(f"/runs/{run['id']}").json()["in_flight"]:
        assert time.monotonic() < deadline, "the run never started a trial"
        time.sleep(0.5)
    http.post(f"/runs/{run['id']}/stop")
    while (state := http.get(f"/runs/{run['id']}").json())["state"] == "running":
        assert time.monotonic() < deadline + 120, "the run did not stop"
        time.sleep(0.5)
    assert state["state"] == "stopped" and state["progress"]["done"] < 3
    assert http.get("/runs/nope").status_code == 404


def test_schemathesis_finds_no_server_error(service, served_study, tmp_path):
    # Path parameters point at the real study so that the fuzzing reaches past the 404s. Starting runs is left
    # out: each would launch engines (the runs test above covers it).
    (tmp_path / "schemathesis.toml").write_text('[parameters]\nname = "svc"\n')
    result = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(tmp_path / "schemathesis.toml"),
         "run", f"{service['url']}/openapi.json", "--checks", "not_a_server_error", "--phases",
         "examples,coverage,fuzzing", "--max-examples", "25", "--seed", "7", "--no-shrink",
         "-H", f"Authorization: Bearer {TOKEN}", "--exclude-path-regex", "/studies/.*/runs$"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    generated = [line for line in result.stdout.splitlines() if "generated" in line]
    assert generated and "passed" in generated[-1], result.stdout[-2000:]


def test_a_schedule_fires_honours_its_window_and_outlives_a_restart_of_the_service(service, served_study):
    http = service["http"]
    exported = json.loads(http.get("/studies/svc/export").text)["trials"]
    before = {t["trial_number"] for t in exported}
    # A window shorter than any trial so far: the run must start none (schedules that stop a trial cut short
    # by its window are tested in test_schedules.py).
    window_s = max(5, int(min(t["timings"]["total_s"] for t in exported if t["timings"].get("total_s")) / 2))
    added = http.post("/schedules", json={"name": "nightly", "study": "svc", "cron": "* * * * *",
                                          "window": f"{window_s}s"})
    assert added.status_code == 201, added.text
    assert http.post("/schedules", json={"name": "bad", "study": "svc", "cron": "61 * * * *",
                                         "window": "1h"}).status_code == 400
    deadline = time.monotonic() + 120  # due within a minute
    while not (runs := http.get("/schedules/nightly/runs").json()) or runs[0]["state"] == "running":
        assert time.monotonic() < deadline, f"the schedule did not fire and finish: {runs}"
        time.sleep(1)
    (run,) = runs
    assert run["state"] == "finished" and run["trials"] == [], run
    assert run["stopped_early"] == "no time left in the window for another trial", run
    assert {t["trial_number"] for t in json.loads(http.get("/studies/svc/export").text)["trials"]} == before
    ended = datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["window_end"])
    assert ended.total_seconds() < 10, run
    assert run["summary"][0].startswith("nightly (study svc): finished")
    assert "stopped early: no time left in the window for another trial" in run["summary"]
    # The schedule lives in the database: a restarted service still has it, with its next time.
    assert stop_service(service["proc"]) == 0
    port = free_port()
    service["proc"] = start_service(service["root"], port)
    service["url"] = f"http://127.0.0.1:{port}"
    service["http"] = httpx.Client(base_url=service["url"], headers={"Authorization": f"Bearer {TOKEN}"},
                                   timeout=120)
    wait_ready(service["proc"], service["url"])
    (listed,) = service["http"].get("/schedules").json()
    assert listed["name"] == "nightly" and listed["next_run"] and listed["last_run"]["id"] >= run["id"]
    assert service["http"].delete("/schedules/nightly").json() == {"removed": "nightly"}
    assert service["http"].get("/schedules").json() == []
