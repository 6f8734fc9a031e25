"""A PostgreSQL URL carries a password: it must never show, not in the command line's output and errors, a
trial's files, the report, the Optuna dashboard's answers, nor anything stored in the database.

`assert_password_absent` is the check, for any text: reuse it for every new place a URL could leak to."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, quote_plus

import httpx
import optuna
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from conftest import running_dashboard
from factories import create_small_study
from postgres import fresh_database
from tuner.storage import Repository
from tuner.workers.launch import free_port
from tuner.workers.trial import ARTIFACTS

def password_forms(password: str) -> set[str]:
    """The password as it may appear: verbatim, or percent-encoded as in a URL or a form."""
    return {password, quote(password, safe=""), quote_plus(password)}


def assert_password_absent(where: str, text: str | bytes, password: str) -> None:
    """Fail, naming the place, if the password shows in `text` in any of its forms."""
    shown = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    found = sorted(form for form in password_forms(password) if form in shown)
    assert not found, f"the database password shows in {where}"


def test_the_check_finds_the_password_in_a_url():
    url = "postgresql+psycopg://tuner:pw-s3cret%2F%40%3A@127.0.0.1:5432/tuner"
    with pytest.raises(AssertionError, match="password shows in a URL"):
        assert_password_absent("a URL", url, make_url(url).password)
    assert_password_absent("a redacted URL", "postgresql+psycopg://tuner:***@127.0.0.1:5432/tuner", "pw-s3cret/@:")


def _tuner(*args: str, expect_ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=900)
    assert (result.returncode == 0) == expect_ok, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def study(tiny_model, tmp_path_factory, postgres_url):
    """One study on a PostgreSQL database of its own, its baseline trial run."""
    root = tmp_path_factory.mktemp("secrets")
    with fresh_database(postgres_url) as url:
        password = make_url(url).password
        assert password and len(password) >= 8, "a password this short cannot be searched for in output"
        common = create_small_study(root, "s", url, tiny_model)
        yield {"root": root, "url": url, "password": password, "common": common,
               "run": _tuner("study", "run", "s", "--no-validate", "--trials", "1", *common)}


@pytest.mark.vllm
def test_command_line_output_and_errors(study):
    common, password = study["common"], study["password"]
    html = study["root"] / "report.html"
    runs = {"study run": study["run"],
            "study create (again)": _tuner("study", "create", "s", "--max-requests", "8", "--fit", "clip", *common,
                                           expect_ok=False),
            "study list": _tuner("study", "list", *common),
            "study list --json": _tuner("study", "list", "--json", *common),
            "study status": _tuner("study", "status", "s", *common),
            "study status (no such study)": _tuner("study", "status", "nope", *common, expect_ok=False),
            "study best": _tuner("study", "best", "s", *common),
            "study best --json": _tuner("study", "best", "s", "--json", *common),
            "study report": _tuner("study", "report", "s", "--html", str(html), *common),
            "study report --json": _tuner("study", "report", "s", "--json", *common),
            "study export": _tuner("study", "export", "s", "--requests", *common),
            "study export --format csv": _tuner("study", "export", "s", "--format", "csv", *common)}
    closed = make_url(study["url"]).set(port=free_port()).render_as_string(hide_password=False)
    runs["study list (database down)"] = _tuner("study", "list", "--storage", closed, expect_ok=False)
    for name, result in runs.items():
        assert_password_absent(f"the output of `tuner {name}`", result.stdout + result.stderr, password)
    # What these commands print is real: the study, its URL (redacted) and its trial.
    assert "***@127.0.0.1" in runs["study list (database down)"].stderr
    assert json.loads(runs["study best --json"].stdout)["serve_command"].startswith("vllm serve ")
    assert "study s already exists" in runs["study create (again)"].stderr
    assert html.stat().st_size > 10_000
    assert_password_absent("the HTML report", html.read_text(), password)


@pytest.mark.vllm
def test_trial_artifacts_on_disk(study):
    files = [path for path in (study["root"] / "artifacts").rglob("*") if path.is_file()]
    names = {path.name for path in files}
    assert set(ARTIFACTS) <= names, names
    for path in files:
        assert_password_absent(str(path), path.read_bytes(), study["password"])


@pytest.mark.vllm
def test_everything_stored_in_the_database(study):
    """Every row of every table, tuner's and Optuna's."""
    engine = sa.create_engine(study["url"])
    try:
        metadata = sa.MetaData()
        metadata.reflect(engine)
        assert {"tuner_studies", "tuner_trials", "tuner_requests", "trials", "trial_user_attributes"} <= set(
            metadata.tables)
        with engine.connect() as conn:
            for table in metadata.sorted_tables:
                rows = conn.execute(sa.select(table)).all()
                assert_password_absent(f"table {table.name}", "\n".join(map(repr, rows)), study["password"])
    finally:
        engine.dispose()
    assert len(Repository(study["url"]).trials("s")) == 1


@pytest.mark.vllm
def test_optuna_dashboard_answers(study):
    with running_dashboard(study["common"]) as dashboard:
        base = dashboard.url
        study_id = optuna.load_study(study_name="s", storage=study["url"])._study_id
        answers = {path: httpx.get(f"{base}{path}", timeout=30) for path in (
            "/dashboard", "/api/meta", "/api/studies", f"/api/studies/{study_id}",
            f"/api/studies/{study_id}/param_importances", f"/csv/{study_id}")}
        detail = answers[f"/api/studies/{study_id}"].json()
        assert [t["number"] for t in detail["trials"]] == [0]
        for artifact in detail["trials"][0]["artifacts"]:
            path = f"/artifacts/{study_id}/{detail['trials'][0]['trial_id']}/{artifact['artifact_id']}"
            answers[path] = httpx.get(f"{base}{path}", timeout=30)
        assert len(answers) == 6 + len(ARTIFACTS), "each of the trial's files"
        for path, answer in answers.items():
            assert answer.status_code == 200, (path, answer.text[:300])
            assert_password_absent(f"the dashboard's answer to {path}", answer.content, study["password"])
    output = dashboard.output
    assert "***@127.0.0.1" in output
    assert_password_absent("the dashboard's own output", output, study["password"])


@pytest.fixture
def ray_temp_dir(monkeypatch):
    """RAY_TMPDIR of this test's own, so that the Ray session kept there is that of the service it starts. Short:
    Ray's Unix sockets are made under it."""
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp", ignore_cleanup_errors=True) as folder:
        monkeypatch.setenv("RAY_TMPDIR", folder)
        yield Path(folder)


@pytest.mark.vllm
def test_service_answers_and_log(study, ray_temp_dir):
    from test_service import start_ready_service, stop_service

    service, port = start_ready_service(study["root"], host="127.0.0.1", token=None, storage=study["url"])
    url = f"http://127.0.0.1:{port}"
    try:
        answers = {path: httpx.get(f"{url}{path}", timeout=120) for path in (
            "/studies", "/studies/s", "/studies/s/best", "/studies/s/report", "/studies/s/report.html",
            "/studies/s/export", "/studies/s/export?format=csv&requests=true", "/runs", "/schedules",
            "/openapi.json")}
        answers["a refused create"] = httpx.post(f"{url}/studies", json={"name": "x", "space": "no-such-space"},
                                                 timeout=120)
        # A run: its process gets the URL from the service, and writes its progress and result where it can be read.
        answers["a run's start"] = httpx.post(f"{url}/studies/s/runs", json={"trials": 1, "validate": False},
                                                timeout=120)
        run_id = answers["a run's start"].json()["id"]
        deadline = time.monotonic() + 600
        while (run := httpx.get(f"{url}/runs/{run_id}", timeout=120)).json()["state"] == "running":
            assert time.monotonic() < deadline, "the run did not end"
            time.sleep(1)
        answers["/runs/{id} (the run ended)"] = run
        answers["/runs (the run ended)"] = httpx.get(f"{url}/runs", timeout=120)
        assert run.json()["state"] == "finished" and run.json()["progress"] == {"done": 1, "of": 1}, run.text
        for where, response in answers.items():
            assert response.status_code in (200, 202, 400), (where, response.text[:300])
            assert_password_absent(f"the service's answer to {where}", response.text, study["password"])
        assert json.loads(answers["/studies"].text)[0]["name"] == "s"
        run_files = list((study["root"] / "artifacts" / "runs" / run_id).iterdir())
        assert {path.name for path in run_files} == {"events.jsonl", "stdout.json", "stderr.log"}
        for path in run_files:
            assert_password_absent(str(path), path.read_bytes(), study["password"])
        for args in (("study", "list"), ("study", "status", "s"), ("study", "best", "s")):
            shown = _tuner(*args, "--server", url)
            assert_password_absent(f"`tuner {' '.join(args)} --server`", shown.stdout + shown.stderr,
                                   study["password"])
    finally:
        assert stop_service(service) == 0
    assert_password_absent("the service's log", (study["root"] / f"service-{port}.log").read_bytes(),
                           study["password"])
    # Ray's logs of the session: the Serve controller's and replica's, the run's driver, its trial's worker.
    ray_logs = [path for path in (ray_temp_dir / "ray" / "session_latest" / "logs").rglob("*") if path.is_file()]
    assert any(path.parent.name == "serve" and path.name.startswith("replica_tuner_") for path in ray_logs), ray_logs
    for path in ray_logs:
        assert_password_absent(f"Ray's log {path}", path.read_bytes(), study["password"])
