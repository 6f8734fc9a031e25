"""The probes a trial finished, kept as it runs so that a re-run of a trial cut off goes on after them, and the
retry of a trial whose driver stopped: once, then again only after a re-run that got further."""

from __future__ import annotations

from dataclasses import replace

import optuna
import pytest

from factories import measurement, request_records
from tuner.storage import trial_dir
from tuner.study.plan import RetryCutTrial
from tuner.workers.engine_config import EngineConfig
from tuner.workers.probe_log import PROBE_LOG, ProbeLog, ResumedProbes
from tuner.workers.probes import Probe, ProbeRun
from tuner.workers.server_metrics import TimelineSample

CONFIG = EngineConfig(max_num_seqs=8, gpu_memory_utilization=0.9, kv_cache_dtype="fp8")
MACHINE = "1 x NVIDIA H200 (140 GiB)"


def _run(index: int, **probe) -> ProbeRun:
    records = request_records(5)
    timeline = [TimelineSample(0.25 * i, 2.0, 1.0, 0.5) for i in range(4)]
    return ProbeRun(Probe(index, 2.0 ** index, 1000 + index, len(records), measurement(), **probe), records,
                    timeline)


def _by(trial: int, run: ProbeRun) -> ProbeRun:
    """The run as a re-run reads it back: measured by trial `trial`."""
    return ProbeRun(replace(run.probe, earlier_trial=trial), run.records, run.timeline)


def test_finished_probes_read_back_as_they_were_written_naming_the_trial_that_measured_them(tmp_path):
    log = ProbeLog(tmp_path / PROBE_LOG)
    log.begin(CONFIG, MACHINE, [])
    runs = [_run(0), _run(1, stop_reason="p95 TTFT cannot meet it")]
    for run in runs:
        log.append(run)
    assert log.read(7, CONFIG) == ResumedProbes(MACHINE, tuple(_by(7, run) for run in runs))


def test_a_log_of_another_configuration_or_of_no_probe_resumes_nothing(tmp_path):
    log = ProbeLog(tmp_path / PROBE_LOG)
    assert log.read(0, CONFIG) is None and not log.runs_again(rerun=True)  # no log at all
    log.begin(CONFIG, MACHINE, [])
    assert log.read(0, CONFIG) is None  # cut off before its first probe ended
    log.append(_run(0))
    assert log.read(0, EngineConfig(max_num_seqs=8)) is None


def test_a_last_line_cut_short_by_the_machines_loss_is_left_out(tmp_path):
    log = ProbeLog(tmp_path / PROBE_LOG)
    log.begin(CONFIG, MACHINE, [])
    log.append(_run(0))
    with open(log.path, "a") as f:
        f.write('{"probe": {"index": 1, "fac')
    resumed = log.read(0, CONFIG)
    assert resumed is not None and [r.probe.index for r in resumed.runs] == [0]


def test_a_rerun_hands_on_the_probes_it_resumed_after_and_runs_again_only_after_one_of_its_own(tmp_path):
    earlier = [_by(2, _run(0)), _by(3, _run(1))]  # trial 4 resumed after trial 2's probe and trial 3's
    log = ProbeLog(tmp_path / PROBE_LOG)
    log.begin(CONFIG, MACHINE, earlier)
    assert not log.runs_again(rerun=True) and log.runs_again(rerun=False)
    assert log.read(4, CONFIG) == ResumedProbes(MACHINE, tuple(earlier))
    log.append(_run(2))
    assert log.runs_again(rerun=True)
    assert [(r.probe.index, r.probe.earlier_trial) for r in log.read(4, CONFIG).runs] == [(0, 2), (1, 3), (2, 4)]


@pytest.fixture
def study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'tuner.db'}")
    return optuna.create_study(study_name="s", storage=storage)


def _cut(study: optuna.Study, retry: RetryCutTrial) -> int:
    """Start the next trial and have its driver stop: Optuna fails it and calls the retry. Its number."""
    trial = study.ask({"x": optuna.distributions.IntDistribution(1, 8)})
    frozen = study._storage.get_trial(trial._trial_id)
    study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    retry(study, frozen)
    return trial.number


def _waiting(study: optuna.Study) -> int:
    return len(study.get_trials(states=(optuna.trial.TrialState.WAITING,)))


def test_a_cut_trial_runs_again_once_and_a_rerun_again_only_if_it_got_further(study, tmp_path):
    retry = RetryCutTrial(tmp_path / "artifacts")
    _cut(study, retry)
    assert _waiting(study) == 1  # a first cut: always run again
    rerun = _cut(study, retry)
    assert _waiting(study) == 0  # a re-run that finished no probe of its own is not queued again
    study.enqueue_trial({"x": 4})
    # The next re-run: its log holds the probe its predecessor resumed after, and one of its own.
    folder = trial_dir(tmp_path / "artifacts", "s", rerun + 1)
    folder.mkdir(parents=True)
    log = ProbeLog(folder / PROBE_LOG)
    log.begin(CONFIG, MACHINE, [_run(0)])
    log.append(_run(1))
    study._storage.set_trial_system_attr(study.get_trials()[-1]._trial_id, "retry_history", [rerun])
    _cut(study, retry)
    queued = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(queued) == 1 and queued[0].system_attrs["retry_history"] == [rerun, rerun + 1]
