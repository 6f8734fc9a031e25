"""Schedules on a real SQLite study with real vLLM: a schedule due a minute ahead fires from a hosting process,
its run honours a window shorter than a trial (the trial is stopped at the window's end and recorded so), the
morning summary is written, and the schedules outlive the host (killed, another started, a run-now fires).
Also: SIGTERM of `tuner study run`, the warm start of a study on a newer trace, bad usage, and the job store
on PostgreSQL."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import optuna
import pytest
from apscheduler.triggers.cron import CronTrigger
from conftest import AZURE_CONV, FIXED_LOAD, NO_LATENCY_LIMIT_ARGS, signal_when_ready, vllm_processes
from conftest import run_tuner as tuner

from tuner.storage import Repository
from tuner.common.errors import TunerError
from tuner.schedules import ScheduleBook, due_time
from tuner.common.durations import parse_duration
from tuner.study.attrs import BASELINE_ATTR, RERUN_ATTR, WARM_START_ATTR
from tuner.study.create import create_study, enqueue_config
from tuner.study.events import NO_TIME_LEFT, WINDOW_END
from tuner.study.plan import StoragePlan, load_optuna_study
from tuner.study.recommendation import best_trials
from tuner.analysis.capacity import LoadPolicy
from tuner.traces.selection import TraceSelection
from tuner.workers.engine_config import EngineConfig
from factories import azure_slice, tiny_space

SPACE = tiny_space("test-schedules", {"max_num_seqs": {"type": "int", "low": 2, "high": 16},
                                     "num_gpu_blocks_override": {"type": "int", "low": 16, "high": 96}})
SLICE = azure_slice(8)
# Room for all 8 requests at once: feasible (no latency limit), so the warm start has it to carry over.
ROOMY = EngineConfig(max_num_seqs=16, num_gpu_blocks_override=96)


def _wait_for(what: str, check, timeout_s: float, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while (found := check()) is None or found is False:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)
    return found


def _no_engine_left(timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while vllm_processes():
        assert time.monotonic() < deadline, f"vLLM left behind: {[p.pid for p in vllm_processes()]}"
        time.sleep(0.5)


def _median_times(plan: StoragePlan, study: str) -> tuple[float, float]:
    """The median engine startup and the median whole trial of a study's trials that served: a run judges
    whether a trial fits its window by the latter."""
    served = [t.timings for t in Repository(plan.url).trials(study) if t.state == "complete"]
    return (statistics.median(t.startup_s for t in served), statistics.median(t.total_s for t in served))


def _host(common: list[str], log: Path) -> subprocess.Popen:
    """`tuner schedule host`, as the service would host the schedules."""
    return subprocess.Popen([sys.executable, "-m", "tuner", "schedule", "host", *common], stdout=subprocess.DEVNULL,
                            stderr=open(log, "ab"))


@pytest.fixture(scope="module")
def lab(tiny_model, tmp_path_factory):
    """Study `s` on traces/day1.csv with two real trials (the baseline and ROOMY), and traces/day2.csv, newer."""
    root = tmp_path_factory.mktemp("schedules")
    (root / "space.yaml").write_text(SPACE)
    traces = root / "traces"
    traces.mkdir()
    shutil.copyfile(AZURE_CONV, traces / "day1.csv")
    # The next day's trace: another file (one request fewer at its end), written later.
    (traces / "day2.csv").write_text("".join(AZURE_CONV.read_text().splitlines(keepends=True)[:-1]))
    day_before = time.time() - 86400
    os.utime(traces / "day1.csv", (day_before, day_before))
    storage = f"sqlite:///{root / 'tuner.db'}"
    common = ["--storage", storage, "--artifacts", str(root / "artifacts")]
    study_args = ["--model", str(tiny_model), "--space", str(root / "space.yaml"), *SLICE, *NO_LATENCY_LIMIT_ARGS,
                  *FIXED_LOAD, *common]
    tuner("study", "create", "s", "--trace", str(traces / "day1.csv"), *study_args)
    plan = StoragePlan.resolve(storage, root / "artifacts")
    enqueue_config("s", plan, ROOMY)
    tuner("study", "run", "s", "--no-validate", "--trials", "2", *common)
    return {"root": root, "traces": traces, "storage": storage, "common": common, "plan": plan,
            "study_args": study_args}


@pytest.mark.vllm
def test_a_schedule_fires_honours_its_window_and_survives_a_restart(lab):
    root, common, plan = lab["root"], lab["common"], lab["plan"]
    # A model no study here has measured (a copy of the tiny one): with no trial time known but the slice's span,
    # the first trial starts. (Study s's trials on the tiny model itself would say it cannot fit the window.)
    shutil.copytree(lab["study_args"][1], root / "unmeasured-model")
    fresh_args = ["--model", str(root / "unmeasured-model"), *lab["study_args"][2:]]
    tuner("study", "create", "fresh", "--trace", str(lab["traces"] / "day1.csv"), *fresh_args)
    # Windows from this machine's own times, so that the verdicts hold at any speed. The nightly window is as
    # long as vLLM took to start in study s: time for the run to start its first trial (judged by the slice's
    # span of about a second), never for that trial to end. The check window is half of study s's median trial,
    # what its run judges by: it cannot hold one, so that run must start none.
    startup_s, trial_s = _median_times(plan, "s")
    window_s = math.ceil(startup_s)
    # A time of day a minute or so ahead: a real cron line that fires once today.
    fire = (datetime.now().astimezone() + timedelta(seconds=70)).replace(second=0, microsecond=0)
    tuner("schedule", "add", "nightly", "--study", "fresh", "--cron", f"{fire.minute} {fire.hour} * * *",
          "--window", f"{window_s}s", "--trials", "3", *common)
    tuner("schedule", "add", "check", "--study", "s", "--cron", "0 3 1 jan *", "--window",
          f"{math.ceil(trial_s / 2)}s", *common)
    host = _host(common, root / "host-a.log")
    with ScheduleBook(plan) as book:
        try:
            run = _wait_for("the nightly run to end",
                            lambda: next((r for r in book.runs("nightly") if r.state != "running"), None),
                            timeout_s=(fire - datetime.now().astimezone()).total_seconds() + 180)
        finally:
            host.send_signal(signal.SIGKILL)  # the host dies, as a service killed outright would
            host.wait(10)
        _no_engine_left()
        window_end = fire + timedelta(seconds=window_s)
        assert run.state == "finished", (root / "host-a.log").read_text()
        assert datetime.fromisoformat(run.due_at) == fire and datetime.fromisoformat(run.window_end) == window_end
        # The one trial started is stopped at the window's end, not re-run.
        assert [(t.number, t.state, t.reason) for t in run.trials] == [(0, "stopped", WINDOW_END)]
        assert run.stopped_early == WINDOW_END and run.best is None and run.previous_best is None
        (stopped,) = Repository(plan.url).trials("fresh")
        stopped_at = datetime.fromisoformat(stopped.finished_at)
        assert window_end - timedelta(seconds=1) <= stopped_at <= window_end + timedelta(seconds=20)
        assert datetime.fromisoformat(run.finished_at) <= window_end + timedelta(seconds=30)
        fresh = optuna.load_study(study_name="fresh", storage=plan.url)
        assert fresh.trials[0].state is optuna.trial.TrialState.FAIL
        assert fresh.trials[0].user_attrs["stop_reason"] == WINDOW_END
        summary = tuner("schedule", "summary", "nightly", *common).stdout
        assert "1 trial: 1 stopped" in summary and f"stopped early: {WINDOW_END}" in summary

        # After the host died both schedules are still there, each with its next regular time.
        listed = {s["name"]: s for s in json.loads(tuner("schedule", "list", "--json", *common).stdout)}
        assert sorted(listed) == ["check", "nightly"]
        assert datetime.fromisoformat(listed["nightly"]["next_run"]) == fire + timedelta(days=1)
        assert listed["nightly"]["last_run"]["id"] == run.id
        regular = datetime.fromisoformat(listed["check"]["next_run"])
        assert (regular.month, regular.day, regular.hour, regular.minute) == (1, 1, 3, 0)

        # Another host runs what the first one stored: a run-now of `check`, added before the restart.
        host = _host(common, root / "host-b.log")
        try:
            tuner("schedule", "run-now", "check", *common)
            check = _wait_for("the check run to end",
                              lambda: next((r for r in book.runs("check") if r.state != "running"), None),
                              timeout_s=180)
            assert book.get("check").next_run == regular, "a run-now keeps the regular times"
        finally:
            host.send_signal(signal.SIGTERM)
            assert host.wait(60) == 0
    assert check.state == "finished", (root / "host-b.log").read_text()
    assert check.trials == [] and check.stopped_early == NO_TIME_LEFT
    s_best = best_trials(Repository(plan.url), Repository(plan.url).get_study("s"), load_optuna_study("s", plan))
    assert check.best.trial == check.previous_best.trial == s_best[0].trial_number
    assert any(line.startswith("best unchanged: trial") for line in check.lines())
    assert any("meets the interactive" in line and "measured on CPU" in line and "vLLM 0.32.0" in line
               for line in check.lines())
    assert "  not validated" in check.lines()  # the study ran with --no-validate: no gain is stated
    assert len(Repository(plan.url).trials("s")) == 2, "the check run must have started no trial"


@pytest.mark.vllm
def test_sigterm_stops_a_study_run_and_records_its_trial(lab):
    common = lab["common"]
    tuner("study", "create", "interrupted", "--trace", str(lab["traces"] / "day1.csv"), *lab["study_args"])
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "study", "run", "interrupted", "--trials", "2", "--json",
                             "--no-validate", *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def engine_started() -> None:
        _wait_for("an engine to start", lambda: bool(vllm_processes()) or proc.poll() is not None, timeout_s=180,
                  every_s=0.2)
        assert proc.poll() is None, proc.stderr.read()

    stdout, stderr = signal_when_ready(proc, engine_started, signal.SIGTERM)
    assert proc.returncode == 130, stderr[-2000:]
    reason = "the run was stopped (SIGTERM)"
    report = json.loads(stdout)
    assert [(t["number"], t["state"], t["reason"]) for t in report["trials"]] == [(0, "stopped", reason)]
    assert report["stopped_early"] == reason
    _no_engine_left()
    (stored,) = Repository(lab["storage"]).trials("interrupted")
    assert stored.state == "stopped" and stored.failure_message == reason and stored.measurement is None
    study = optuna.load_study(study_name="interrupted", storage=lab["storage"])
    assert study.trials[0].state is optuna.trial.TrialState.FAIL
    # Its configuration (the baseline) is queued again, once, to run first next time.
    rerun = study.trials[1]
    assert rerun.state is optuna.trial.TrialState.WAITING
    assert rerun.user_attrs[RERUN_ATTR] == 0 and rerun.user_attrs[BASELINE_ATTR]


@pytest.mark.vllm
def test_a_study_on_the_newest_trace_starts_from_the_previous_studys_best(lab):
    plan = lab["plan"]
    repo = Repository(plan.url)
    earlier = best_trials(repo, repo.get_study("s"), load_optuna_study("s", plan))
    carried = [t for t in earlier if t.engine_config.max_num_seqs]  # vLLM's defaults are run anyway
    assert carried, f"ROOMY must be feasible in study s: {[(t.trial_number, t.score) for t in repo.trials('s')]}"
    args = lab["study_args"]
    created = json.loads(tuner("study", "create", "s2", "--trace-latest", str(lab["traces"]), *args,
                               "--json").stdout)
    assert created["trace_path"] == str((lab["traces"] / "day2.csv").resolve())
    assert created["warm_start"]["from"] == "s"
    assert created["warm_start"]["trials"] == [t.trial_number for t in carried]
    waiting = optuna.load_study(study_name="s2", storage=plan.url).trials
    # A trial not yet asked for keeps its enqueued values among Optuna's system attributes.
    queued = [t.system_attrs.get("fixed_params") for t in waiting]
    assert waiting[0].user_attrs[BASELINE_ATTR] and queued[0] == {}
    searched = ("max_num_seqs", "num_gpu_blocks_override")
    assert queued[1:] == [{k: getattr(t.engine_config, k) for k in searched} for t in carried]
    assert [t.user_attrs[WARM_START_ATTR] for t in waiting[1:]] == [f"s trial {t.trial_number}" for t in carried]
    assert all(t.state is optuna.trial.TrialState.WAITING for t in waiting)

    # A source that does not exist is refused before anything is created.
    failed = subprocess.run([sys.executable, "-m", "tuner", "study", "create", "s3", "--trace-latest",
                             str(lab["traces"]), "--warm-from", "nope", *args], capture_output=True, text=True)
    assert failed.returncode == 2 and failed.stderr.strip() == "error: no study named nope"
    assert "s3" not in {s.name for s in repo.list_studies()}


def _tuner_fails(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_bad_schedules_are_refused_with_one_line(tiny_model, tmp_path):
    plan = StoragePlan.resolve(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    create_study("s", model=tiny_model, trace_path=AZURE_CONV, space="cpu-small", boundary_name="interactive",
                 limits={}, plan=plan, selection=TraceSelection(max_requests=8, fit="clip"), load=LoadPolicy.fixed())
    common = ["--storage", plan.url, "--artifacts", str(plan.artifact_dir)]
    add = ["schedule", "add", "n", "--study", "s", *common]
    assert "Wrong number of fields" in _tuner_fails(*add, "--cron", "0 1 * *", "--window", "5h")
    assert "higher than the maximum" in _tuner_fails(*add, "--cron", "0 25 * * *", "--window", "5h")
    assert "by name" in _tuner_fails(*add, "--cron", "0 1 * * 1-5", "--window", "5h")
    assert "a duration is like" in _tuner_fails(*add, "--cron", "0 1 * * *", "--window", "5 hours")
    assert _tuner_fails("schedule", "add", "n", "--study", "nope", "--cron", "0 1 * * *", "--window", "5h",
                        *common) == "error: no study named nope"
    assert _tuner_fails("schedule", "remove", "n", *common) == "error: no schedule named n"
    assert _tuner_fails("schedule", "run-now", "n", *common) == "error: no schedule named n"
    tuner(*add, "--cron", "0 1 * * mon-fri", "--window", "1h30m")
    assert _tuner_fails(*add, "--cron", "0 2 * * *", "--window", "1h") == "error: schedule n already exists"
    with ScheduleBook(plan) as book:
        (kept,) = book.list()
    assert (kept.cron, kept.window_s, kept.trials) == ("0 1 * * mon-fri", 5400.0, None)


def test_durations_and_due_times():
    assert [parse_duration(t) for t in ("5h", "30m", "90s", "1h30m", "0.5h", "45")] == [
        18000, 1800, 90, 5400, 1800, 45]
    for bad in ("5x", "", "0s", "-5m", "h", "inf"):
        with pytest.raises(TunerError):
            parse_duration(bad)
    nightly = CronTrigger.from_crontab("0 1 * * *", timezone=timezone.utc)
    at = datetime(2026, 3, 4, 3, 0, tzinfo=timezone.utc)
    one_am = at.replace(hour=1)
    assert due_time(nightly, 5 * 3600, at) == one_am, "a late start keeps only the rest of its window"
    assert due_time(nightly, 5 * 3600, one_am) == one_am
    assert due_time(nightly, 3600, at) == at, "outside any window a run gets a whole one"


def test_schedules_live_in_postgresql(tiny_model, tmp_path, postgres_database):
    plan = StoragePlan.resolve(postgres_database, tmp_path / "artifacts")
    create_study("s", model=tiny_model, trace_path=AZURE_CONV, space="cpu-small", boundary_name="interactive",
                 limits={}, plan=plan, selection=TraceSelection(max_requests=8, fit="clip"), load=LoadPolicy.fixed())
    with ScheduleBook(plan) as book:
        added = book.add("nightly", study="s", cron="0 1 * * *", window_s=5 * 3600, trials=6)
    assert added.next_run.hour == 1 and added.next_run > datetime.now(timezone.utc)
    with ScheduleBook(plan) as reopened:  # another process, as far as the database can tell
        (listed,) = reopened.list()
        assert (listed.name, listed.study, listed.window_s, listed.trials) == ("nightly", "s", 18000.0, 6)
        due = reopened.run_now("nightly").next_run
        assert abs((due - datetime.now(timezone.utc)).total_seconds()) < 30
        assert reopened.runs("nightly") == []
        reopened.remove("nightly")
        assert reopened.list() == []
