"""tuner/storage/: tuner's tables beside Optuna's in one real database, migrations, records and artifacts; every test
that takes `url` runs on a SQLite file and on a PostgreSQL database of its own."""

from __future__ import annotations

import threading
from dataclasses import replace

import optuna
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from tuner.storage import (Repository, StoredTrial, VERSION_TABLE, alembic_config,
                           attach_trial_artifacts, default_artifact_dir, default_storage_url, redact_url,
                           trial_artifacts)
from tuner.storage.schema import Base, ScheduleRunRow, TraceRow, include_name
from tuner.storage.records import StoredRun, StoredScheduleRun
from tuner.analysis.capacity import JudgedProbe, Verdict
from tuner.common.errors import TunerError
from tuner.analysis.scoring import Rejection, Score
from tuner.traces.records import Trace, TraceFit, TraceRequest, Transformation
from tuner.traces.stats import trace_stats
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import FailureClass, classify_failure
from tuner.workers.measure import Pace
from tuner.workers.probes import Probe
from tuner.workers.trial import TrialRecord

from factories import request_records, study_settings, trial_record

TUNER_TABLES = {"tuner_studies", "tuner_traces", "tuner_trials", "tuner_requests", "tuner_schedule_runs",
                "tuner_runs"}
LATEST = "0008"  # tuner's newest Alembic revision


@pytest.fixture
def repo(url: str) -> Repository:
    repository = Repository(url)
    repository.migrate()
    return repository


def stored(record: TrialRecord, number: int = 3, **kwargs) -> StoredTrial:
    score = Score(1.5, 0.4, 64.0, 1.0, {"ttft_p95_s": -0.5}, [])
    return StoredTrial.from_record("s1", number, record, state=kwargs.pop("state", "complete"), score=score,
                                   finished_at="2025-05-01T10:06:00+00:00", **kwargs)


def row_count(repo: Repository, table: str) -> int:
    with repo.engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one()


def revision(repo: Repository, table: str) -> list[str]:
    with repo.engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT version_num FROM {table}")).scalars())


def test_migrate_twice_is_a_no_op(url):
    repo = Repository(url)
    repo.migrate()
    repo.save_study(study_settings())
    repo.migrate()
    assert TUNER_TABLES | {VERSION_TABLE} <= set(sa.inspect(repo.engine).get_table_names())
    assert revision(repo, VERSION_TABLE) == [LATEST]
    assert [s.name for s in repo.list_studies()] == ["s1"]


@pytest.mark.parametrize("optuna_first", [True, False])
def test_tables_and_revisions_live_beside_optunas(url, optuna_first):
    if optuna_first:
        optuna_storage = optuna.storages.RDBStorage(url)
        Repository(url).migrate()
    else:
        Repository(url).migrate()
        optuna_storage = optuna.storages.RDBStorage(url)
    repo = Repository(url)
    names = set(sa.inspect(repo.engine).get_table_names())
    assert TUNER_TABLES | {VERSION_TABLE, "studies", "trials", "alembic_version"} <= names
    assert revision(repo, VERSION_TABLE) == [LATEST]
    assert revision(repo, "alembic_version") == [optuna_storage.get_head_version()]
    # Both sides still work on the shared file.
    study = optuna.create_study(study_name="s1", storage=optuna_storage)
    study.tell(study.ask(), 1.0)
    repo.save_study(study_settings())
    assert len(study.trials) == 1 and repo.get_study("s1") == study_settings()


def assert_migrated_to_the_schema(url: str) -> None:
    optuna.storages.RDBStorage(url)  # Optuna's tables must not count as drift
    repo = Repository(url)
    repo.migrate()
    with repo.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_name": include_name, "compare_type": True,
                                                         "version_table": VERSION_TABLE})
        assert compare_metadata(context, Base.metadata) == []
    command.check(alembic_config(url))  # `alembic check`, through env.py and its filter


def test_migration_matches_the_schema(url):
    assert_migrated_to_the_schema(url)


@pytest.mark.parametrize("earlier", ["0001", "0003", "0005", "0006", "0007"])
def test_an_upgrade_from_an_earlier_revision_keeps_every_study_and_trial(url, earlier):
    # 0007's first form rebuilt tuner_studies (Alembic's batch mode on SQLite) and the drop of the old table deleted
    # every trial through ON DELETE CASCADE: found on a run whose database was upgraded under it.
    command.upgrade(alembic_config(url), earlier)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        studies, trials = (sa.Table(name, sa.MetaData(), autoload_with=conn) for name in ("tuner_studies",
                                                                                           "tuner_trials"))
        # Every column a row must have, filled with a value of its kind; the rest left to their defaults.
        def row(table: sa.Table, given: dict) -> dict:
            kinds = {sa.Integer: 1, sa.Float: 1.0, sa.JSON: {}, sa.Boolean: False}
            return {**{c.name: next((v for k, v in kinds.items() if isinstance(c.type, k)), "x")
                       for c in table.columns if not c.nullable and c.server_default is None and not c.primary_key},
                    **given}
        study_id = conn.execute(studies.insert().values(row(studies, {"name": "kept"}))).inserted_primary_key[0]
        for number in range(3):
            conn.execute(trials.insert().values(row(trials, {"study_id": study_id, "trial_number": number})))
        # A derived space on a GPU offered an fp8 KV cache before FP8 was opt-in: that study goes on searching it.
        offered = "parameters:\n  kv_cache_dtype: {type: categorical, choices: [auto, fp8]}\n"
        conn.execute(studies.insert().values(row(studies, {"name": "fp8", "space_text": offered})))
    engine.dispose()
    repo = Repository(url)
    repo.migrate()
    assert revision(repo, VERSION_TABLE) == [LATEST]
    assert (row_count(repo, "tuner_studies"), row_count(repo, "tuner_trials")) == (2, 3)
    with repo.engine.connect() as conn:  # a study stored before 0007 allows FP8 only where its space searched it
        allowed = conn.execute(sa.text("SELECT name, allow_fp8 FROM tuner_studies ORDER BY name")).all()
    assert [tuple(r) for r in allowed] == [("fp8", earlier < "0007"), ("kept", False)]
    assert repo.runs("kept") == []  # 0008: runs are kept from now on


def test_a_schedule_runs_table_made_by_hand_before_0002_is_kept_by_the_upgrade(url):
    # The database as the code before revision 0002 left it: tuner's tables at 0001, and tuner_schedule_runs
    # made by hand (as tuner.schedules made it: no naming convention), with a run in it.
    command.upgrade(alembic_config(url), "0001")
    by_hand = sa.Table(
        "tuner_schedule_runs", sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("schedule", sa.String(191), nullable=False, index=True),
        *(sa.Column(name, sa.String(length), nullable=False)
          for name, length in (("study", 512), ("state", 32), ("due_at", 64), ("started_at", 64), ("window_end", 64))),
        sa.Column("finished_at", sa.String(64)),
        sa.Column("summary", sa.JSON, nullable=False))
    run = {"schedule": "nightly", "study": "s1", "state": "finished", "due_at": "2026-12-01T01:00:00+00:00",
           "started_at": "2026-12-01T01:00:01+00:00", "window_end": "2026-12-01T06:00:00+00:00",
           "finished_at": "2026-12-01T05:59:00+00:00", "summary": {"trials": [], "best": None}}
    repo = Repository(url)
    by_hand.create(repo.engine)
    with repo.engine.begin() as conn:
        conn.execute(sa.insert(by_hand).values(run))

    repo.migrate()
    assert revision(repo, VERSION_TABLE) == [LATEST]
    runs = ScheduleRunRow.__table__
    with repo.engine.begin() as conn:
        conn.execute(sa.insert(runs).values({**run, "finished_at": None}))  # the ids go on from the old rows
        rows = conn.execute(sa.select(runs).order_by(runs.c.id)).mappings().all()
    assert [(row["id"], row["finished_at"], row["summary"]) for row in rows] == [
        (1, run["finished_at"], run["summary"]), (2, None, run["summary"])]
    # The same schema as a fresh database's, constraint names included where the database keeps them.
    assert_migrated_to_the_schema(url)
    if repo.engine.dialect.name == "postgresql":
        assert sa.inspect(repo.engine).get_pk_constraint("tuner_schedule_runs")["name"] == "pk_tuner_schedule_runs"


def test_studies(repo):
    # The second allows FP8 (it changes the model's numerics): its creator's choice is kept with it.
    first, second = study_settings(), study_settings(name="s2", created_at="2025-05-02T10:00:00+00:00", allow_fp8=True)
    repo.save_study(second)
    repo.save_study(first)
    assert repo.get_study("s1") == first
    assert repo.list_studies() == [first, second]
    assert [s.allow_fp8 for s in repo.list_studies()] == [False, True]
    with pytest.raises(TunerError, match="study s1 already exists"):
        repo.save_study(replace(first, model="/models/other"))
    assert repo.get_study("s1").model == "/models/tiny"
    with pytest.raises(TunerError, match="no study named nope"):
        repo.get_study("nope")


def test_trace_is_stored_once_per_sha256(repo):
    requests = tuple(TraceRequest(0.5 * i, 100 + i, 20, (1, 2)) for i in range(10))
    windowed = Trace("azure.csv", "azure", "cd" * 32, requests,
                     (Transformation("window", {"start_s": 0, "end_s": 60}, 3),))
    repo.save_trace(windowed, trace_stats(windowed))
    again = Trace("elsewhere/azure.csv", "azure", "cd" * 32, requests[:4])
    repo.save_trace(again, trace_stats(again))
    with Session(repo.engine) as session:  # nothing in tuner reads the row back: the test reads it itself
        kept = vars(session.get(TraceRow, "cd" * 32))
    assert kept["source"] == "azure.csv" and kept["requests"] == 10 and kept["span_s"] == 4.5
    assert kept["transformations"] == [{"kind": "window", "params": {"start_s": 0, "end_s": 60}, "affected": 3}]
    assert kept["stats"] == trace_stats(windowed).to_dict()
    assert row_count(repo, "tuner_traces") == 1


def test_trial_with_requests_and_failure_round_trips(repo):
    repo.save_study(study_settings())
    records = request_records(5)
    trial = stored(trial_record(records, died=True), state="failed", attempt=2)
    assert trial.failure_class == FailureClass.ENGINE_DIED.value and trial.measurement.requests == 5
    requests = records
    trial_id = repo.save_trial(trial, requests)

    [back] = repo.trials("s1")
    assert back == trial and back.id == trial_id
    assert back.timings.to_dict() == {"startup_s": 12.5, "replay_s": 3.0, "teardown_s": 0.5,
                                       "compile_cache": "unused", "sleep_s": 0.0, "total_s": 16.0}
    assert repo.requests("s1", 3) == requests
    assert repo.requests("s1", 3)[-1].outcome == "not_sent"
    failure = {"trial_number": back.trial_number, "attempt": back.attempt, "failure_class": back.failure_class,
               "message": back.failure_message, "exit_code": back.exit_code, "log_excerpt": back.log_excerpt,
               "estimated_max_model_len": back.estimated_max_model_len}
    assert failure == {"trial_number": 3, "attempt": 2, "failure_class": "engine_died",
                       "message": trial.failure_message, "exit_code": -9, "log_excerpt": trial.log_excerpt,
                       "estimated_max_model_len": None}
    assert "worker killed" in failure["log_excerpt"]


def test_a_run_is_stored_then_updated_as_it_goes_and_goes_with_its_study(repo):
    repo.save_study(study_settings())
    run = repo.save_run(StoredRun("s1", 1000.0, 1000.0, 2, 1, budget_s=1200.0))
    assert run.id is not None and repo.runs("s1") == [run]
    later = repo.save_run(replace(run, ended_at=1300.0, trials=(0, 1)))
    assert repo.runs("s1") == [later] and later.held_s == 600.0
    repo.save_run(StoredRun("s1", 2000.0, 2100.0, 1, 0, (2,)))
    assert [r.trials for r in repo.runs("s1")] == [(0, 1), (2,)]
    with repo.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM tuner_studies"))
    assert row_count(repo, "tuner_runs") == 0


def test_a_schedules_run_is_stored_ended_and_read_back_the_latest_first(repo):
    def started(schedule: str, at: str) -> StoredScheduleRun:
        return repo.save_schedule_run(StoredScheduleRun(schedule, "s1", "running", at, at, "2026-12-01T06:00:00+00:00",
                                                        None, {"trials": [], "best": None}))

    first = started("nightly", "2026-12-01T01:00:00+00:00")
    assert first.id is not None and repo.schedule_runs("nightly") == [first]
    ended = repo.save_schedule_run(replace(first, state="finished", finished_at="2026-12-01T05:59:00+00:00",
                                           summary={"trials": [{"number": 0}], "best": {"trial": 0}}))
    second, other = started("nightly", "2026-12-02T01:00:00+00:00"), started("weekly", "2026-12-02T01:00:00+00:00")
    assert repo.schedule_runs("nightly") == [second, ended] and repo.schedule_runs("nightly", 1) == [second]
    assert [r.id for r in repo.schedule_runs("nightly")] == [second.id, first.id]
    repo.end_schedule_runs("running", "interrupted", "2026-12-02T02:00:00+00:00")
    assert [(r.state, r.finished_at) for r in repo.schedule_runs("nightly") + repo.schedule_runs("weekly")] == [
        ("interrupted", "2026-12-02T02:00:00+00:00"), ("finished", "2026-12-01T05:59:00+00:00"),
        ("interrupted", "2026-12-02T02:00:00+00:00")]
    assert repo.schedule_runs("weekly")[0].id == other.id and repo.schedule_runs("never") == []


def test_a_probes_pace_with_its_carried_share_round_trips(repo):
    # The pace rule reads the carried share; it must come back from the database as the worker measured it.
    repo.save_study(study_settings())
    pace = Pace(window_s=12.0, steady_arrivals=200, steady_completed=174, drain_s=6.5, e2e_trend=1.4, lag_s=2.5,
                carried_share=0.87)
    record = trial_record(request_records(5), died=False)
    record = replace(record, measurement=replace(record.measurement, pace=pace))
    probe = JudgedProbe(Probe(0, 1.0, 1000, 5, record.measurement), Verdict.FAIL,
                        ["did not keep up: in a span as long as one copy of the trace, it served 87%"])
    trial = stored(record, probes=[probe])
    repo.save_trial(trial, [])
    [back] = repo.trials("s1")
    assert back.measurement.pace == pace and back.probes == [probe]
    assert back.probes[0].probe.measurement.pace.carried_share == 0.87


def test_a_trials_fit_to_its_context_is_stored_and_read_back(repo):
    repo.save_study(study_settings())
    record = trial_record(request_records(5), died=False)
    fit = TraceFit("clip", 8192, 60, 3)
    trial = stored(replace(record, trace=replace(record.trace, fit=fit)))
    assert trial.trace_fit == fit
    repo.save_trial(trial, request_records(5))
    [back] = repo.trials("s1")
    assert back.trace_fit == fit and back == trial
    unfitted = stored(record, number=4)
    repo.save_trial(unfitted, [])
    assert repo.trials("s1")[1].trace_fit is None


def test_resaving_a_trial_number_replaces_it(repo):
    repo.save_study(study_settings())
    first = stored(trial_record(request_records(6), died=True), state="worker_lost")
    repo.save_trial(first, request_records(6))
    other = stored(trial_record(request_records(2), died=False), number=4)
    repo.save_trial(other, request_records(2))

    rerun = stored(trial_record(request_records(3), died=False), attempt=2)
    repo.save_trial(rerun, request_records(3))

    assert repo.trials("s1") == [rerun, other]
    assert len(repo.requests("s1", 3)) == 3 and len(repo.requests("s1", 4)) == 2
    assert row_count(repo, "tuner_requests") == 5  # the first run's six are gone


def test_kv_failure_without_requests(repo):
    repo.save_study(study_settings())
    log = "INFO loading\nValueError: ... the estimated maximum model length is 2048. Try increasing ...\n"
    failed = replace(trial_record([], died=False), measurement=None, failure=classify_failure(1, log))
    trial = stored(failed, number=0, state="failed", prune_reason=None)
    repo.save_trial(trial, [])
    [back] = repo.trials("s1")
    assert back == trial and back.measurement is None and back.estimated_max_model_len == 2048
    assert repo.requests("s1", 0) == []
    assert [(t.failure_class, t.estimated_max_model_len) for t in repo.trials("s1")] == [("kv_insufficient", 2048)]


def test_a_proposal_refused_before_launch_keeps_its_class(repo):
    repo.save_study(study_settings())
    reason = ("kv_insufficient (predicted): the KV cache is estimated at 512 tokens from num_gpu_blocks_override, "
              "below one request of max_model_len (1024)")
    refused = StoredTrial(
        study_name="s1", trial_number=2, attempt=1, state="infeasible",
        engine_config=EngineConfig(num_gpu_blocks_override=4),
        serve_command="vllm serve /models/tiny --num-gpu-blocks-override 4", measurement=None,
        failure_class="kv_insufficient (predicted)", failure_message=reason, log_excerpt=None,
        estimated_max_model_len=None, exit_code=None, timings=None, hardware=None, vllm_version="",
        started_at="2025-05-01T10:00:00+00:00", finished_at="2025-05-01T10:00:00+00:00",
        score=Rejection([reason]))
    repo.save_trial(refused, [])
    assert repo.trials("s1") == [refused]


def test_foreign_keys_are_enforced(repo):
    repo.save_study(study_settings())
    trial_id = repo.save_trial(stored(trial_record(request_records(4), died=True), state="failed"),
                               request_records(4))
    with repo.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM tuner_trials WHERE id = :id"), {"id": trial_id})
    assert row_count(repo, "tuner_requests") == 0
    with pytest.raises(sa.exc.IntegrityError), repo.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO tuner_requests (trial_id, request_index, scheduled_s, requested_tokens, "
                             "input_tokens, output_tokens, outcome) VALUES (999, 0, 0, 1, 1, 1, 'ok')"))


def test_two_writers_share_one_database(repo, url):
    repo.save_study(study_settings())
    errors: list[BaseException] = []

    def write(first: int) -> None:
        other = Repository(url)  # an engine of its own, as another process would have
        try:
            for number in range(first, first + 10):
                other.save_trial(stored(trial_record(request_records(3), died=False), number=number),
                                 request_records(3))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(first,)) for first in (0, 100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [t.trial_number for t in repo.trials("s1")] == [*range(10), *range(100, 110)]
    assert row_count(repo, "tuner_requests") == 60


def test_records_validate_their_states():
    with pytest.raises(ValueError, match="trial state"):
        stored(trial_record(request_records(2), died=False), state="done")
    with pytest.raises(ValueError, match="boundary"):
        replace(study_settings(), boundary="offline")


def test_redact_url():
    shown = redact_url("postgresql+psycopg://tuner:s3cret@db:5432/tuner")
    assert "s3cret" not in shown and shown == "postgresql+psycopg://tuner:***@db:5432/tuner"
    assert "s3cret" not in redact_url("postgresql://tuner@db/tuner?password=s3cret&sslmode=require")
    assert redact_url("not a url://tuner:s3cret@db") == "not a url://tuner:***@db"
    assert redact_url("sqlite:////data/tuner.db") == "sqlite:////data/tuner.db"


def test_unreachable_database_names_the_redacted_url(tmp_path):
    missing = f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}"
    with pytest.raises(TunerError, match="cannot reach the database at sqlite:///.*no-such-dir/x.db: "
                                         "unable to open database file"):
        Repository(missing).migrate()
    with pytest.raises(TunerError, match="cannot reach the database") as caught:
        Repository(missing).list_studies()
    assert caught.value.__cause__ is None

    postgres = "postgresql+psycopg://u:pw-s3cret@127.0.0.1:1/db"
    with pytest.raises(TunerError, match=r"cannot reach the database at postgresql\+psycopg://u:\*\*\*@") as caught:
        Repository(postgres).migrate()
    assert "pw-s3cret" not in str(caught.value)


def test_default_locations(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    url = default_storage_url()
    assert url == f"sqlite:///{tmp_path / 'home' / 'tuner.db'}" and (tmp_path / "home").is_dir()
    assert default_artifact_dir(url) == tmp_path / "home" / "tuner-artifacts"
    assert default_artifact_dir("postgresql+psycopg://u:pw@db/tuner") == tmp_path / "home" / "artifacts"


def test_trial_artifacts_round_trip(url, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))  # where a server database's artifacts go
    study = optuna.create_study(study_name="s1", storage=url)
    trial = study.ask()
    log = tmp_path / "server.log"
    log.write_text("INFO serving\n")
    csv = tmp_path / "requests.csv"
    csv.write_text("index,outcome\n0,ok\n")
    artifact_dir = default_artifact_dir(url)
    ids = attach_trial_artifacts(study, trial, [log, tmp_path / "absent.json", csv], artifact_dir)
    assert len(ids) == 2 and artifact_dir.is_dir()

    reloaded = optuna.load_study(study_name="s1", storage=url)
    metas = trial_artifacts(reloaded, trial._trial_id)
    assert {m.artifact_id: m.filename for m in metas} == dict(zip(ids, ["server.log", "requests.csv"]))
    assert {m.filename: m.mimetype for m in metas}["requests.csv"] == "text/csv"
    for meta, original in zip(sorted(metas, key=lambda m: ids.index(m.artifact_id)), [log, csv]):
        copy = tmp_path / f"copy-{meta.filename}"
        optuna.artifacts.download_artifact(artifact_store=optuna.artifacts.FileSystemArtifactStore(artifact_dir),
                                           file_path=str(copy), artifact_id=meta.artifact_id)
        assert copy.read_bytes() == original.read_bytes()


def test_the_launch_failures_table_goes_and_comes_back_from_the_trials_without_a_loss(url):
    # Revision 0003 drops tuner_launch_failures, whose columns repeated the trials'; its downgrade rebuilds it.
    command.upgrade(alembic_config(url), LATEST)
    repo = Repository(url)
    repo.save_study(study_settings())
    died = stored(trial_record(request_records(4), died=True), state="failed")
    repo.save_trial(died, request_records(4))
    repo.save_trial(stored(trial_record(request_records(2), died=False), number=4), request_records(2))
    assert "tuner_launch_failures" not in sa.inspect(repo.engine).get_table_names()

    command.downgrade(alembic_config(url), "0002")
    with repo.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT f.failure_class, f.message, f.exit_code, f.log_excerpt FROM "
                                    "tuner_launch_failures f JOIN tuner_trials t ON t.id = f.trial_id")).all()
    assert rows == [(died.failure_class, died.failure_message, died.exit_code, died.log_excerpt)]
    command.upgrade(alembic_config(url), LATEST)
    assert repo.trials("s1")[0] == died
