"""The database failing: unreachable when a command starts, and lost while a study runs. Either way the command
ends with one line naming the database (its password hidden), never a traceback, and nothing stored is lost."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from conftest import AZURE_CONV, DescendantWatch, assert_none_left, vllm_processes
from factories import create_small_study
from postgres import PostgresCluster
from tuner.storage import Repository, redact_url
from test_secrets import assert_password_absent
from tuner.workers.launch import free_port

PASSWORD = "pw-faults-s3cret"


def _closed_port(tmp_path: Path, postgres_url: str) -> str:
    return f"postgresql+psycopg://tuner:{PASSWORD}@127.0.0.1:{free_port()}/tuner"


def _wrong_password(tmp_path: Path, postgres_url: str) -> str:
    return make_url(postgres_url).set(password=PASSWORD).render_as_string(hide_password=False)


def _missing_folder(tmp_path: Path, postgres_url: str) -> str:
    return f"sqlite:///{tmp_path / 'no-such-folder' / 'tuner.db'}"


def _folder_is_a_file(tmp_path: Path, postgres_url: str) -> str:
    (tmp_path / "a-file").write_text("")
    return f"sqlite:///{tmp_path / 'a-file' / 'tuner.db'}"


UNREACHABLE = {"postgresql-closed-port": _closed_port, "postgresql-wrong-password": _wrong_password,
               "sqlite-missing-folder": _missing_folder, "sqlite-folder-is-a-file": _folder_is_a_file}


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=300)


def database_error_line(result: subprocess.CompletedProcess, url: str, password: str) -> tuple[str, list[str]]:
    """A non-zero exit ending on one `error:` line that names the database by its redacted URL, no traceback, no
    password; returns that line and the lines before it."""
    *before, last = [line for line in result.stderr.splitlines() if line.strip()] or [""]
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith(f"error: cannot reach the database at {redact_url(url)}: "), result.stderr[-3000:]
    assert_password_absent("the command's output", result.stdout + result.stderr, password)
    return last, before


@pytest.mark.parametrize("database", UNREACHABLE)
@pytest.mark.parametrize("command", ["list", "create", "run"])
def test_unreachable_database_at_start(command, database, tiny_model, tmp_path, postgres_url):
    url = UNREACHABLE[database](tmp_path, postgres_url)
    args = {"list": ["study", "list"],
            "create": ["study", "create", "s", "--model", str(tiny_model), "--trace", str(AZURE_CONV),
                       "--max-requests", "8", "--fit", "clip"],
            "run": ["study", "run", "s", "--no-validate", "--trials", "1"]}[command]
    result = _tuner(*args, "--storage", url, "--artifacts", str(tmp_path / "artifacts"))
    assert result.returncode == 2
    assert database_error_line(result, url, PASSWORD)[1] == [], "the error must be the only line"
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "no-such-folder").exists()


@pytest.mark.vllm
def test_database_lost_mid_run_stops_the_run_and_keeps_finished_trials(tiny_model, tmp_path):
    """The server dies (an immediate shutdown, as in a crash) while trial 1 runs, after trial 0 was stored."""
    with PostgresCluster.throwaway() as (cluster, url):
        common = create_small_study(tmp_path, "s", url, tiny_model)
        repo = Repository(url)
        storage = optuna.storages.RDBStorage(url)
        with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
            driver = subprocess.Popen([sys.executable, "-m", "tuner", "study", "run", "s", "--trials", "3",
                                       "--no-validate", "--heartbeat", "1", *common], stdout=stdout, stderr=stderr,
                                      text=True)
        watch = DescendantWatch(driver.pid)
        watch.start()
        deadline = time.monotonic() + 400
        while True:
            assert driver.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "trial 1 never started after trial 0 was stored"
            finished = repo.trials("s")
            trials = optuna.load_study(study_name="s", storage=storage).trials
            if finished and len(trials) > 1 and trials[1].state is TrialState.RUNNING and vllm_processes():
                break
            time.sleep(0.5)
        cluster.stop("immediate")
        stopped_at = time.monotonic()
        driver.wait(timeout=400)
        result = subprocess.CompletedProcess(driver.args, driver.returncode, (tmp_path / "stdout").read_text(),
                                             (tmp_path / "stderr").read_text())
        line, before = database_error_line(result, url, make_url(url).password)
        assert any(progress.startswith("trial 0 (baseline): complete") for progress in before), before
        assert "the run stopped" in line
        print(f"driver stopped {time.monotonic() - stopped_at:.1f} s after the database: {line}")
        assert not vllm_processes(), "the engine of the trial in flight must be stopped with the run"
        print(f"the driver's processes, none left: {sorted(Counter(assert_none_left(watch)).items())}")

        cluster.start()
        # The same repository as before the crash: its dropped connections are replaced, not an error.
        assert repo.trials("s") == finished, "every trial stored before the database was lost must still be there"
        after = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url)).trials
        assert [t.state for t in after[:len(finished)]] == [TrialState.COMPLETE] * len(finished)
        # The trial in flight stays RUNNING without heartbeat: the next driver fails it as stale and re-runs it.
        assert after[len(finished)].state is TrialState.RUNNING
