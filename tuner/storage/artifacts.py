"""A trial's files (server log, per-request CSV, measurement JSON) kept with it through optuna.artifacts."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.artifacts import ArtifactMeta, FileSystemArtifactStore, get_all_artifact_meta, upload_artifact
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial


def trial_dir(artifact_dir: Path, study: str, number: int) -> Path:
    """Where a study's trial keeps its files: its engine's log, its records, and the probes it finished so far."""
    return Path(artifact_dir) / "trials" / study / f"trial-{number:04d}"


def _storage(study: optuna.Study) -> BaseStorage:
    # Optuna has no public accessor, and a FrozenTrial's artifacts cannot be reached without the storage.
    return study._storage


def _trial(study: optuna.Study, trial_id_or_trial: int | Trial | FrozenTrial) -> Trial | FrozenTrial:
    """The trial itself; an int is Optuna's trial id (`trial._trial_id`), not its number in the study."""
    if isinstance(trial_id_or_trial, int):
        return _storage(study).get_trial(trial_id_or_trial)
    return trial_id_or_trial


def attach_trial_artifacts(study: optuna.Study, trial_id_or_trial: int | Trial | FrozenTrial, files: list[Path],
                           artifact_dir: Path) -> list[str]:
    """Upload the files that exist into `artifact_dir`, linked to the trial; returns their artifact ids."""
    artifact_dir.mkdir(parents=True, exist_ok=True)
    store = FileSystemArtifactStore(artifact_dir)
    trial = _trial(study, trial_id_or_trial)
    return [upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial, storage=_storage(study))
            for path in files if Path(path).is_file()]


def trial_artifacts(study: optuna.Study, trial_id_or_trial: int | Trial | FrozenTrial) -> list[ArtifactMeta]:
    """What is attached to the trial: ids, file names and MIME types."""
    return get_all_artifact_meta(_trial(study, trial_id_or_trial), storage=_storage(study))
