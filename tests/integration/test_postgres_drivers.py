"""Four drivers on one PostgreSQL study at once: every Optuna trial runs once and is recorded once in tuner's
tables, each with artifacts of its own in the shared artifact folder."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from factories import create_small_study
from tuner.storage import Repository, trial_artifacts
from tuner.workers.trial import ARTIFACTS

pytestmark = pytest.mark.vllm

DRIVERS = 4


def test_four_drivers_share_one_study(tiny_model, tmp_path, postgres_database):
    url = postgres_database
    common = create_small_study(tmp_path, "shared", url, tiny_model)
    # Four local Ray instances and four engines on one machine: slow, but each driver is on its own.
    drivers = []
    for index in range(DRIVERS):
        with open(tmp_path / f"driver-{index}.out", "w") as out, open(tmp_path / f"driver-{index}.err", "w") as err:
            drivers.append(subprocess.Popen([sys.executable, "-m", "tuner", "study", "run", "shared", "--trials", "1",
                                             "--no-validate", "--json", *common], stdout=out, stderr=err))
    ran = []
    for index, driver in enumerate(drivers):
        driver.wait(timeout=900)
        assert driver.returncode == 0, (tmp_path / f"driver-{index}.err").read_text()[-3000:]
        ran.append([t["number"] for t in json.loads((tmp_path / f"driver-{index}.out").read_text())["trials"]])

    # Each driver ran one trial, and no trial was run by two drivers (the baseline was taken once).
    assert sorted(number for numbers in ran for number in numbers) == list(range(DRIVERS)), ran
    study = optuna.load_study(study_name="shared", storage=url)
    frozen = study.get_trials(deepcopy=False)
    assert [t.number for t in frozen] == list(range(DRIVERS))
    assert all(t.state is TrialState.COMPLETE for t in frozen), [t.state for t in frozen]
    assert sum(bool(t.user_attrs.get("baseline")) for t in frozen) == 1

    repo = Repository(url)
    stored = repo.trials("shared")
    assert [t.trial_number for t in stored] == list(range(DRIVERS)), "one row per trial, no number twice"
    assert all(t.attempt == 1 and t.state == "complete" for t in stored), [(t.trial_number, t.state) for t in stored]
    for trial, row in zip(frozen, stored):
        assert len(repo.requests("shared", row.trial_number)) == row.measurement.requests == 8
        folder = tmp_path / "artifacts" / "trials" / "shared" / f"trial-{row.trial_number:04d}"
        measured = json.loads((folder / "measurement.json").read_text())
        assert measured["measurement"] == row.measurement.to_dict(), "each trial's files are its own, not another's"
        assert (folder / "server.log").stat().st_size > 0
        assert sorted(m.filename for m in trial_artifacts(study, trial)) == sorted(ARTIFACTS)
    ids = [m.artifact_id for trial in frozen for m in trial_artifacts(study, trial)]
    assert len(set(ids)) == len(ids) == len(ARTIFACTS) * DRIVERS
