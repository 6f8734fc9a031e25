"""The tuner service for real: `tuner serve` on Ray Serve, bound off loopback with a bearer token; the study
commands through `--server`; two real trials run by the service; best and report over HTTP; schemathesis
against the OpenAPI spec; by default loopback only, the service and its Ray cluster."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from conftest import AZURE_CONV, FIXED_LOAD, NO_LATENCY_LIMIT_ARGS, signal_when_ready
from conftest import run_tuner as tuner
from tuner.workers.launch import free_port

pytestmark = pytest.mark.vllm

TOKEN = "test-token-5f0c"


def start_service(root: Path, port: int, *, host: str | None = "0.0.0.0", token: str | None = TOKEN,
                  token_file: Path | None = None, storage: str | None = None) -> subprocess.Popen:
    """`tuner serve` on `port`: on `host` (None: its default), the token from TUNER_API_TOKEN or `token_file`."""
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_API_TOKEN", "TUNER_API_TOKEN_FILE")}
    if token:
        env["TUNER_API_TOKEN"] = token
    options = (["--host", host] if host else []) + (["--token-file", str(token_file)] if token_file else [])
    log = open(root / f"service-{port}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "tuner", "serve", *options, "--port", str(port),
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


def start_ready_service(root: Path, **options) -> tuple[subprocess.Popen, int]:
    """`start_service` on a free port, once it answers: the service and its port. A port found free can be taken
    by another process (the other xdist worker's engines, Ray) before the service binds it; the service then says
    so in one line, and another port is tried."""
    for _ in range(3):
        port = free_port()
        proc = start_service(root, port, **options)
        try:
            wait_ready(proc, f"http://127.0.0.1:{port}")
            return proc, port
        except AssertionError:
            if proc.poll() is None or "cannot serve on" not in (root / f"service-{port}.log").read_text():
                raise
    raise AssertionError("three free ports were taken before the service could bind them")


def stop_service(proc: subprocess.Popen) -> int:
    proc.send_signal(2)
    return proc.wait(90)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("service")
    proc, port = start_ready_service(root)
    url = f"http://127.0.0.1:{port}"
    current = {"root": root, "url": url, "proc": proc,
               "http": httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)}
    try:
        yield current
    finally:
        assert stop_service(current["proc"]) == 0  # the restart test replaces it


def remote(service, *args: str, token: str | None = TOKEN, check: bool = True,
           extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNER_API_TOKEN": token or "", **(extra_env or {})}
    result = subprocess.run([sys.executable, "-m", "tuner", *args, "--server", service["url"]], capture_output=True,
                            text=True, timeout=900, env=env)
    if check:
        assert result.returncode == 0, result.stderr[-3000:] + runs_stderr(service)
    return result


def runs_stderr(service) -> str:
    """The end of what each run the service started printed to its stderr: where a failed run says why."""
    logs = sorted((service["root"] / "artifacts" / "runs").glob("*/stderr.log"))
    return "".join(f"\n--- {log}:\n{log.read_text(errors='replace')[-3000:]}" for log in logs)


def test_off_loopback_without_a_token_the_service_refuses_to_start(tmp_path):
    port = free_port()
    assert start_service(tmp_path, port, token=None).wait(60) == 2
    log = (tmp_path / f"service-{port}.log").read_text()
    assert "refusing to serve on 0.0.0.0 without a token" in log and "Traceback" not in log


def test_an_address_another_process_listens_on_is_refused_in_one_line(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert start_service(tmp_path, port, host="127.0.0.1", token=None).wait(60) == 2
    log = (tmp_path / f"service-{port}.log").read_text()
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in log and "Traceback" not in log


def an_address_other_than_loopback() -> str:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                return address.address
    # Failed, never skipped: a loopback-only bind that was not checked must not count as passing.
    pytest.fail("this machine has no address but loopback, so binding to loopback only cannot be checked")


def is_loopback_address(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.0.0.1 too


def test_by_default_the_service_and_its_ray_answer_on_loopback_only_and_the_token_is_read_from_a_file(tmp_path):
    file_token = "file-token-9d41c7"
    token_file = tmp_path / "token"
    token_file.write_text(f"{file_token}\n")
    proc, port = start_ready_service(tmp_path, host=None, token=None, token_file=token_file)
    url = f"http://127.0.0.1:{port}"
    try:
        other_address = an_address_other_than_loopback()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{other_address}:{port}/healthz", timeout=5)
        # Every socket the service and its local Ray cluster listen on, Ray's own servers among them.
        tree = {proc.pid} | {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        listening = {(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in psutil.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in tree}
        assert {"gcs_server", "raylet"} <= {name for _, _, name in listening}, listening
        assert any(listened_port == port for _, listened_port, _ in listening), listening
        # All on loopback but one: Ray Serve binds its replica's inter-deployment gRPC server to [::] whatever
        # the node's address; Ray's token authentication refuses whoever calls it without Ray's token.
        open_to_others = [s for s in listening if not is_loopback_address(s[0])]
        # (The replica's process title gains the method it is running, e.g. ".check_health".)
        assert [name.split(".")[0] for _, _, name in open_to_others] == ["ray::ServeReplica:tuner:tuner-api"], \
            listening
        with grpc.insecure_channel(f"{other_address}:{open_to_others[0][1]}") as channel:
            with pytest.raises(grpc.RpcError) as refused_call:
                channel.unary_unary("/ray.serve.ASGIService/HandleRequest")(b"", timeout=10)
        assert refused_call.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The service's token is the file's (TUNER_API_TOKEN is unset), and so is the command line's.
        assert httpx.get(f"{url}/studies").status_code == 401
        assert httpx.get(f"{url}/studies", headers={"Authorization": f"Bearer {file_token}"}).json() == []
        here = {"url": url}
        by_env = remote(here, "study", "list", "--json", token=None,
                        extra_env={"TUNER_API_TOKEN_FILE": str(token_file)})
        by_option = remote(here, "study", "list", "--json", "--token-file", str(token_file), token=None)
        assert json.loads(by_env.stdout) == json.loads(by_option.stdout) == []
        refused = remote(here, "study", "list", token=None, check=False)
        assert refused.returncode == 2 and "refused the request" in refused.stderr
    finally:
        assert stop_service(proc) == 0
    assert file_token not in (tmp_path / f"service-{port}.log").read_text()


@pytest.mark.parametrize("option", [["--ray-address", "127.0.0.1:6379"], ["--heartbeat", "5"], ["--grace", "60"]])
def test_run_options_the_service_does_not_take_are_refused_with_server(option):
    # Refused before any request: nothing listens on port 9.
    refused = subprocess.run([sys.executable, "-m", "tuner", "study", "run", "svc", *option, "--server",
                              "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: Invalid value: {option[0]} cannot be used with --server: the service's runs "
                           f"use its own Ray cluster and settings"), line


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
                                # This test is about the service, not speed.
                                *NO_LATENCY_LIMIT_ARGS, *FIXED_LOAD).stdout)
    run = remote(service, "study", "run", "svc", "--no-validate", "--trials", "2", "--budget", "30m")
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
    # The budget reached the run on the service, which planned with it and states what it spent.
    said = " ".join(served_study["run_stderr"].split())
    assert "budget 30m00s of CPU slot time on 1 CPU slot: no validation;" in said
    spent = run["result"]["spent"]
    assert spent["unit"] == "CPU slot" and len(spent["trials"]) == 2
    assert status["spent"]["runs"] == 1 and status["spent"]["total"]["total_s"] >= spent["total"]["total_s"]


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


def wait_for_a_trial_in_flight(http: httpx.Client, run_id: str | None = None, timeout_s: float = 900,
                               starter: subprocess.Popen | None = None) -> dict:
    """The run (`run_id`, else the one running) once it has a trial in flight. A guard against a run that never
    starts, not a speed test (beside other engines one took over 4 minutes); fails at once if `starter`, the
    process that starts the run, has exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = [http.get(f"/runs/{run_id}").json()] if run_id else http.get("/runs").json()
        running = [r for r in runs if r["state"] == "running" and r["in_flight"]]
        if running:
            return running[0]
        assert starter is None or starter.poll() is None, f"the run's starter exited: {starter.stderr.read()}"
        assert time.monotonic() < deadline, f"no run started a trial: {runs}"
        time.sleep(0.5)


def test_ctrl_c_on_a_run_through_the_service_stops_it_there_and_waits_for_its_result(service, served_study):
    http = service["http"]
    # RAY_ADDRESS in the environment is not --ray-address: it is no reason to refuse a run on the service.
    env = {**os.environ, "TUNER_API_TOKEN": TOKEN, "RAY_ADDRESS": "127.0.0.1:9"}
    cli = subprocess.Popen([sys.executable, "-m", "tuner", "study", "run", "svc", "--trials", "3", "--no-validate",
                            "--server", service["url"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env)
    in_flight: list[dict] = []
    stdout, stderr = signal_when_ready(cli, lambda: in_flight.append(wait_for_a_trial_in_flight(http, starter=cli)),
                                       signal.SIGINT, timeout_s=300)
    (run,) = in_flight
    assert cli.returncode == 130, stderr[-3000:]
    ended = http.get(f"/runs/{run['id']}").json()
    assert ended["state"] == "stopped" and ended["progress"]["done"] < 3, ended
    # What a local run prints when stopped: each trial's line, the stopped one among them, and why it stopped.
    stopped = [t for t in ended["result"]["trials"] if t["state"] == "stopped"]
    assert stopped and f"trial {stopped[0]['number']}: stopped: the run was stopped" in stderr, stderr[-3000:]
    assert f"stopped after {len(ended['result']['trials'])} trials: the run was stopped" in stdout, stdout
    assert "Traceback" not in stderr
    assert http.get("/runs/nope").status_code == 404


def test_schemathesis_finds_no_server_error(service, served_study, tmp_path):
    # Path parameters point at the real study so that the fuzzing reaches past the 404s. Starting runs is left
    # out: each would launch engines (the runs test above covers it).
    (tmp_path / "schemathesis.toml").write_text('[parameters]\nname = "svc"\n')
    result = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(tmp_path / "schemathesis.toml"),
         "run", f"{service['url']}/openapi.json", "--checks", "not_a_server_error", "--phases",
         "examples,coverage,fuzzing", "--max-examples", "25", "--seed", "7", "--no-shrink",
         # The check is for server errors, not speed: on a busy machine a request took over the 10 s default.
         "--request-timeout", "120",
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
    service["proc"], port = start_ready_service(service["root"])
    service["url"] = f"http://127.0.0.1:{port}"
    service["http"] = httpx.Client(base_url=service["url"], headers={"Authorization": f"Bearer {TOKEN}"},
                                   timeout=120)
    (listed,) = service["http"].get("/schedules").json()
    assert listed["name"] == "nightly" and listed["next_run"] and listed["last_run"]["id"] >= run["id"]
    assert service["http"].delete("/schedules/nightly").json() == {"removed": "nightly"}
    assert service["http"].get("/schedules").json() == []


def has_exited(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # reparented, it may never be reaped
    except psutil.NoSuchProcess:
        return True


def test_a_run_dies_with_the_service_replica_that_started_it(service, served_study):
    http = service["http"]
    run = http.post("/studies/svc/runs", json={"trials": 3, "validate": False}).json()
    wait_for_a_trial_in_flight(http, run["id"])
    below = psutil.Process(service["proc"].pid).children(recursive=True)
    (replica,) = [p for p in below if "ServeReplica:tuner:tuner-api" in " ".join(p.cmdline())]
    (run_process,) = [p for p in replica.children() if "study run svc" in " ".join(p.cmdline())]
    replica.kill()  # no __del__, no stop_all: only the kernel can tell the run
    deadline = time.monotonic() + 120
    while not has_exited(run_process):
        assert time.monotonic() < deadline, "the run outlived the replica that started it"
        time.sleep(0.5)
    # Serve starts a replica in its place. The run was told by SIGTERM, so it stopped its trial and recorded it
    # rather than leaving it running.
    wait_ready(service["proc"], service["url"])
    assert http.get("/studies/svc").json()["running"] == []
