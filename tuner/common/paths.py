"""Where tuner keeps what it makes by default, and what it ships."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def tuner_home() -> Path:
    """$TUNER_HOME, else ~/.local/share/tuner."""
    return Path(os.environ.get("TUNER_HOME") or Path.home() / ".local" / "share" / "tuner")


def default_tiny_model() -> Path:
    """Where the tiny default model is kept (under tuner_home()); the folder may not exist yet."""
    return tuner_home() / "models" / "tiny"


def shipped_root() -> Path:
    """The folder under which the files tuner ships but imports by no name lie at their repository paths:
    `search_spaces/` (the bundled spaces, schema.json) and `storage/migrations/`."""
    package = Path(__file__).resolve().parents[1]  # tuner/, this module being in tuner/common/
    # A wheel holds them inside the package (setup.py); a checkout, installed editable or on PYTHONPATH, in the
    # repository's top-level folders beside it.
    return package if (package / "storage" / "migrations").is_dir() else package.parent


def bundled_trace() -> Path:
    """The first 1,000 requests of the Azure 2023 conversation trace (CC-BY 4.0, see ATTRIBUTION.md beside it)."""
    return Path(str(resources.files("tuner") / "data" / "traces" / "azure_conv_2023_first1000.csv"))
