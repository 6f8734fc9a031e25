"""The storage plan brings tuner's tables to the newest revision once per process and database, not on every
call (the service opens a repository per request)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from alembic import command

from tuner.storage import DatabaseUnreachable
from tuner.study.plan import StoragePlan


@pytest.fixture
def upgrades(monkeypatch) -> list[str]:
    """The database URL of every Alembic upgrade run from now on."""
    seen: list[str] = []
    upgrade = command.upgrade

    def counted(config, revision, **kwargs):
        seen.append(config.get_main_option("sqlalchemy.url"))
        return upgrade(config, revision, **kwargs)

    monkeypatch.setattr(command, "upgrade", counted)
    return seen


def sqlite_plan(path: Path) -> StoragePlan:
    return StoragePlan.resolve(f"sqlite:///{path}", path.parent / "artifacts")


def test_migrations_run_once_per_process_and_database(tmp_path, upgrades):
    plan = sqlite_plan(tmp_path / "a.db")
    plan.repository()
    assert plan.repository().list_studies() == []
    sqlite_plan(tmp_path / "a.db").repository()  # another plan, the same database
    assert upgrades == [plan.url]
    other = sqlite_plan(tmp_path / "b.db")
    other.repository()
    other.repository()
    assert upgrades == [plan.url, other.url]


def test_threads_opening_a_database_at_once_migrate_it_once(tmp_path, upgrades):
    plan = sqlite_plan(tmp_path / "a.db")
    threads = [threading.Thread(target=plan.repository) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert upgrades == [plan.url]


def test_a_failed_migration_is_tried_again(tmp_path, upgrades):
    plan = sqlite_plan(tmp_path / "later" / "a.db")
    with pytest.raises(DatabaseUnreachable):
        plan.repository()
    (tmp_path / "later").mkdir()
    assert plan.repository().list_studies() == []


def test_an_sqlite_file_made_again_is_migrated_again(tmp_path, upgrades):
    plan = sqlite_plan(tmp_path / "a.db")
    plan.repository()
    (tmp_path / "a.db").unlink()
    assert plan.repository().list_studies() == []
    assert upgrades == [plan.url, plan.url]
