"""Reading and writing tuner's tables: one short transaction per call, plain records in and out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, delete, event, insert, select, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tuner.storage.records import StoredRun, StoredScheduleRun, StoredTrial, StudySettings
from tuner.storage.schema import Base, RequestRow, RunRow, ScheduleRunRow, StudyRow, TraceRow, TrialRow
from tuner.storage.urls import redact_url
from tuner.common.errors import NotFound, TunerError
from tuner.common.paths import shipped_root
from tuner.traces.records import Trace
from tuner.traces.stats import TraceStats
from tuner.workers.request_record import RequestRecord

MIGRATIONS = shipped_root() / "storage" / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def alembic_config(url: str) -> Config:
    """Alembic's configuration for tuner's migrations, built in code: no alembic.ini is needed."""
    config = Config()
    # Config values go through configparser interpolation, where "%" (as in a quoted password) is special.
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _prepare_sqlite(engine: Engine) -> None:
    """Foreign keys on, a wait instead of an error when another process writes, and real transactions."""

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Left to itself, sqlite3 opens transactions late (and commits before DDL); SQLAlchemy emits BEGIN instead.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        # Taking the write lock up front: a read-then-write transaction that had to upgrade its lock later
        # would fail at once with "database is locked" when another process is writing, whatever the timeout.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


class DatabaseUnreachable(TunerError):
    """The database cannot be reached (down, refused, wrong password, no such file): one line naming it."""

    @classmethod
    def from_error(cls, url: str, exc: OperationalError) -> DatabaseUnreachable:
        """The URL with its password hidden, and the driver's reason (its first line; no password either)."""
        reason = str(exc.orig if exc.orig is not None else exc).strip().splitlines()[0]
        password = make_url(url).password
        if password:
            reason = reason.replace(str(password), "***")
        return cls(f"cannot reach the database at {redact_url(url)}: {reason}")


def _columns(row: Base) -> dict[str, Any]:
    """A row's values by attribute name (a record's field names)."""
    return {column.key: getattr(row, column.key) for column in row.__mapper__.column_attrs}


def _request(row: RequestRow) -> RequestRecord:
    values = _columns(row)
    del values["id"], values["trial_id"]
    return RequestRecord.from_dict(values)


class Repository:
    """tuner's tables in the database at `url`, which may also hold Optuna's.

    Records go in and come out typed (StudySettings, StoredTrial, RequestRecord), each read back equal to what
    was saved; their JSON columns hold what the records' `to_dict` gives."""

    def __init__(self, url: str):
        self._url = url
        self.display_url = redact_url(url)
        try:
            # pre_ping: a connection the server dropped (a restart) is replaced instead of failing the next call.
            self.engine = create_engine(url, pool_pre_ping=True)
        except (ArgumentError, ValueError):
            raise TunerError(f"not a database URL: {self.display_url}") from None
        except ImportError as exc:
            raise TunerError(f"no driver for {self.display_url}: {exc}") from None
        if self.engine.dialect.name == "sqlite":
            _prepare_sqlite(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Repository({self.display_url!r})"

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """A session in one transaction, committed on success; the database lost at any point in it (connect,
        statement, commit) becomes TunerError."""
        try:
            with self._sessions.begin() as session:
                yield session
        except OperationalError as exc:
            raise DatabaseUnreachable.from_error(self._url, exc) from None

    def migrate(self) -> None:
        """Bring tuner's tables to the newest revision; a no-op when they are there already."""
        try:
            with self.engine.connect() as connection, connection.begin():
                config = alembic_config(self._url)
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        except OperationalError as exc:
            raise DatabaseUnreachable.from_error(self._url, exc) from None

    # Studies

    def save_study(self, settings: StudySettings) -> None:
        """Store a new study; TunerError if one of that name exists."""
        try:
            with self._transaction() as session:
                session.add(StudyRow(**settings.to_dict()))
        except IntegrityError:
            raise TunerError(f"study {settings.name} already exists") from None

    def get_study(self, name: str) -> StudySettings:
        """The study's settings; NotFound if there is no such study."""
        with self._transaction() as session:
            return StudySettings.from_dict(_columns(self._study_row(session, name)))

    def list_studies(self) -> list[StudySettings]:
        """Every study, the oldest first."""
        with self._transaction() as session:
            rows = session.scalars(select(StudyRow).order_by(StudyRow.created_at, StudyRow.id))
            return [StudySettings.from_dict(_columns(row)) for row in rows]

    @staticmethod
    def _study_row(session: Session, name: str) -> StudyRow:
        row = session.scalars(select(StudyRow).where(StudyRow.name == name)).one_or_none()
        if row is None:
            raise NotFound(f"no study named {name}")
        return row

    # Traces

    def save_trace(self, trace: Trace, stats: TraceStats) -> None:
        """Store a trace's summary, unless one with the same sha256 is stored already (that one is kept)."""
        row = TraceRow(sha256=trace.sha256, source=trace.source, format=trace.format, requests=len(trace.requests),
                       span_s=trace.span_s, stats=stats.to_dict(),
                       transformations=[asdict(step) for step in trace.transformations])
        try:
            with self._transaction() as session:
                if session.get(TraceRow, trace.sha256) is None:
                    session.add(row)
        except IntegrityError:
            pass  # another process stored the same trace in the meantime, which is all that was wanted

    # Trials

    def save_trial(self, trial: StoredTrial, requests: list[RequestRecord]) -> int:
        """Store a trial with its requests (and its launch failure, if any), replacing any earlier row for its
        number, requests and all; returns the new row's id."""
        with self._transaction() as session:
            study_id = self._study_row(session, trial.study_name).id
            # The foreign keys cascade, so the old row's requests go with it.
            session.execute(delete(TrialRow).where(TrialRow.study_id == study_id,
                                                   TrialRow.trial_number == trial.trial_number))
            values = trial.to_dict()
            del values["study_name"]
            row = TrialRow(study_id=study_id, **values)
            session.add(row)
            session.flush()
            if requests:
                session.execute(insert(RequestRow), [{"trial_id": row.id, **r.to_dict()} for r in requests])
            return row.id

    def trials(self, study_name: str) -> list[StoredTrial]:
        """The study's stored trials, by trial number."""
        with self._transaction() as session:
            study = self._study_row(session, study_name)
            rows = session.scalars(select(TrialRow).where(TrialRow.study_id == study.id)
                                   .order_by(TrialRow.trial_number))
            return [StoredTrial.from_dict({**_columns(row), "study_name": study.name}) for row in rows]

    def requests(self, study_name: str, trial_number: int) -> list[RequestRecord]:
        """The replayed requests of one trial of the study, by index."""
        with self._transaction() as session:
            study_id = self._study_row(session, study_name).id
            rows = session.scalars(
                select(RequestRow).join(TrialRow, RequestRow.trial_id == TrialRow.id)
                .where(TrialRow.study_id == study_id, TrialRow.trial_number == trial_number)
                .order_by(RequestRow.index))
            return [_request(row) for row in rows]

    # Runs

    def save_run(self, run: StoredRun) -> StoredRun:
        """Store a run, or update it where it has a row's id already (its end and trials grow as it goes); returns
        it with its row's id."""
        with self._transaction() as session:
            values = run.to_dict()
            values["study_id"] = self._study_row(session, values.pop("study_name")).id
            if run.id is None:
                row = RunRow(**values)
                session.add(row)
                session.flush()
                return StoredRun.from_dict({**run.to_dict(), "id": row.id})
            row = session.get_one(RunRow, run.id)
            for key, value in values.items():
                setattr(row, key, value)
            return run

    def runs(self, study_name: str) -> list[StoredRun]:
        """The study's runs, the oldest first."""
        with self._transaction() as session:
            study = self._study_row(session, study_name)
            rows = session.scalars(select(RunRow).where(RunRow.study_id == study.id).order_by(RunRow.id))
            return [StoredRun.from_dict({**_columns(row), "study_name": study.name}) for row in rows]

    # Schedules' runs

    def save_schedule_run(self, run: StoredScheduleRun) -> StoredScheduleRun:
        """Store a schedule's run, or update it where it has a row's id already (it ends with its summary);
        returns it with its row's id."""
        with self._transaction() as session:
            if run.id is None:
                row = ScheduleRunRow(**run.to_dict())
                session.add(row)
                session.flush()
                return StoredScheduleRun.from_dict({**run.to_dict(), "id": row.id})
            row = session.get_one(ScheduleRunRow, run.id)
            for key, value in run.to_dict().items():
                setattr(row, key, value)
            return run

    def schedule_runs(self, schedule: str, limit: int | None = None) -> list[StoredScheduleRun]:
        """The schedule's runs, the latest first (also those of a schedule since removed)."""
        with self._transaction() as session:
            rows = session.scalars(select(ScheduleRunRow).where(ScheduleRunRow.schedule == schedule)
                                   .order_by(ScheduleRunRow.id.desc()).limit(limit))
            return [StoredScheduleRun.from_dict(_columns(row)) for row in rows]

    def end_schedule_runs(self, was: str, state: str, finished_at: str) -> None:
        """End every schedule's run still in state `was`: put it in `state`, ended at `finished_at`."""
        with self._transaction() as session:
            session.execute(update(ScheduleRunRow).where(ScheduleRunRow.state == was)
                            .values(state=state, finished_at=finished_at))
