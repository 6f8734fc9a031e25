"""Storage URLs: the default one, where artifacts go beside it, and how one is shown without its password."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tuner.common.paths import tuner_home

_USERINFO_PASSWORD = re.compile(r"(://[^:/@?#]*:)[^@]*@")
# libpq also takes the password as a query parameter.
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def default_storage_url() -> str:
    """An SQLite file in tuner's home, whose folder is created if missing."""
    home = tuner_home().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'tuner.db'}"


def redact_url(url: str) -> str:
    """The URL with any password shown as `***`, fit for logs, reports and errors."""
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        shown = _USERINFO_PASSWORD.sub(r"\1***@", url)
    return _QUERY_PASSWORD.sub(r"\1***", shown)


def default_artifact_dir(url: str) -> Path:
    """`<db stem>-artifacts` beside an SQLite file; tuner's home otherwise (a server database has no folder)."""
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() == "sqlite" and database and database != ":memory:":
        path = Path(database)
        return path.with_name(f"{path.stem}-artifacts")
    return tuner_home() / "artifacts"
