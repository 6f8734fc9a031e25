"""The paired validation (`tuner.workers.paired.run_paired`, `StudyRunner.validate`) against stand-in servers.

A stand-in (tests/sleep_server.py), because sleep mode cannot run here: vLLM's CPU build has none
(`Platform.is_sleep_mode_available` is False on it, and `--enable-sleep-mode` is refused at startup). Each stand-in
answers /sleep, /wake_up and /is_sleeping as vLLM 0.24 does, serves completions while awake and refuses them asleep,
and keeps the calls it had. What is real: the stop machinery of a launch (each stand-in leads its own process group
and is stopped as an engine is), the probes (warm-up, wait for an idle engine, replay, the load search) and the
records written. Checked: the engines take turns (each launched and put to sleep before the next starts, then in
each step each woken, warmed up, probed and put back to sleep, the order reversed in even rounds, never two awake),
each step probes both at the same load, and every engine is stopped whatever ends the pairing; then the driver's
side, each arm's round concluded as a paired validation launch."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from optuna.trial import TrialState as OptunaState

from conftest import AZURE_CONV, NO_LATENCY_LIMIT_ARGS, NO_LATENCY_LIMITS, REPO, run_tuner
from tuner.analysis.capacity import LoadPolicy, Verdict, judge_probe
from tuner.cli.options import storage_plan
from tuner.common.hardware import detect_hardware
from tuner.analysis.scoring import boundary
from tuner.storage.artifacts import trial_dir
from tuner.traces.records import Trace, TraceRequest
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import classify_failure
from tuner.workers.launch import EngineLaunchError, RunningEngine, free_port
from tuner.workers.paired import PairedSpec, run_paired
from tuner.workers.request_record import Outcome
from tuner.workers.trial import TrialSpec

STAND_IN = REPO / "tests" / "sleep_server.py"
# Five short requests 0.1 s apart; a probe holds at least 5 and lasts at least 0.5 s. The stand-in keeps up with
# any of the loads, so each arm's search passes 1, 2 and 4 times the reference and spends its budget of 3.
TRACE = Trace("synthetic", "native", "0" * 64, tuple(TraceRequest(0.1 * i, 16, 4) for i in range(5)))
PLAN = LoadPolicy(probe_budget=3, probe_requests=5, probe_seconds=0.5, warmup_requests=2).plan(
    boundary("interactive", NO_LATENCY_LIMITS))
# A study's load search with short probes (16 requests, 2 s), 2 a trial (a validation launch 4), up to twice the
# reference load: a stand-in passes that and the search ends there.
SEARCHED = ["--max-requests", "16", "--rate-scale", "6", "--fit", "clip", "--probe-requests", "16",
            "--probe-seconds", "2", "--probe-budget", "2", "--load-range", "0.25:2", *NO_LATENCY_LIMIT_ARGS]
# What vLLM 0.24 says when the GPU lacks the memory share an engine asks for (vllm/v1/worker/utils.py).
NO_ROOM = ("ValueError: Free memory on device cuda:0 (5.12/79.19 GiB) on startup is less than desired GPU memory "
           "utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
           "processes.")


class StandIns:
    """Launches a stand-in per arm, in the order asked (`refusals[k]`: the flags of the k-th, or the error its launch
    raises), its calls written under `folder`, and keeps what it launched."""

    def __init__(self, folder: Path, refusals: dict[int, list[str] | BaseException] | None = None,
                 startup_s: float = 0.0):
        self.folder, self.refusals = folder, refusals or {}
        self.startup_s = startup_s  # the least a launch takes, as a GPU engine's cold start does
        self.engines: list[RunningEngine] = []

    def __call__(self, spec: TrialSpec) -> RunningEngine:
        refusal = self.refusals.get(len(self.engines), [])
        if isinstance(refusal, BaseException):
            raise refusal
        port, log = free_port(), spec.out_dir / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, str(STAND_IN), "--port", str(port), "--calls",
                str(self.folder / f"calls-{len(self.engines)}.jsonl"), *refusal]
        started, launched_at = time.monotonic(), time.time()
        with open(log, "wb") as out:  # its own group, as an engine's guard leads one: stopped the same way
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       cwd=STAND_IN.parent)
        engine = RunningEngine(process, argv, f"http://127.0.0.1:{port}", log, 0.0, launched_at)
        self.engines.append(engine)
        while not _healthy(engine):
            assert process.poll() is None and time.monotonic() < started + 30, log.read_text()
            time.sleep(0.1)
        time.sleep(max(0.0, started + self.startup_s - time.monotonic()))
        engine.startup_s = time.monotonic() - started
        return engine

    def calls(self) -> list[tuple[int, str]]:
        """Every engine's calls, by time: (engine, call), a run of completions to one engine as one `probe`."""
        timed = sorted((call["at"], arm, call["call"]) for arm in range(len(self.engines))
                       for call in map(json.loads, (self.folder / f"calls-{arm}.jsonl").read_text().splitlines()))
        merged: list[tuple[int, str]] = []
        for _, arm, call in timed:
            call = "probe" if call == "completion" else call
            if not (call == "probe" and merged and merged[-1] == (arm, "probe")):
                merged.append((arm, call))
        return merged

    def stopped(self) -> bool:
        """Whether every stand-in launched has exited."""
        return all(engine.process.poll() is not None for engine in self.engines)

    def stop(self) -> None:
        """Stop whatever a failed test left running."""
        for engine in self.engines:
            engine.stop()


def _healthy(engine: RunningEngine) -> bool:
    try:
        return httpx.get(f"{engine.base_url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _config(arm: int) -> EngineConfig:
    return EngineConfig() if arm == 0 else EngineConfig(max_num_seqs=4)


def _spec(folder: Path, model: Path, rounds: int = 2) -> PairedSpec:
    return PairedSpec(tuple(tuple(TrialSpec(model, TRACE, _config(arm), folder / f"trial-{2 * r + arm}",
                                            startup_timeout_s=30, request_timeout_s=30, load=PLAN)
                                  for arm in range(2)) for r in range(rounds)))


def _taking_turns(probes: list[tuple[int, int]]) -> list[tuple[int, str]]:
    """The calls the engines of two arms get, each launched and put to sleep, then through rounds of (arm 0's, arm
    1's) probes: step by step, arm 0 first in odd rounds and arm 1 in even ones, the order reversed at each step (A B,
    B A), the engine awake going on and the other woken only when its turn comes, the one awake put to sleep first.
    Probes one after the other on one engine are one `probe` (`StandIns.calls`)."""
    calls, awake = [(0, "sleep level 1"), (1, "sleep level 1")], None
    for number, counts in enumerate(probes, start=1):
        order = [0, 1] if number % 2 else [1, 0]
        for step in range(max(counts)):
            for arm in order if step % 2 == 0 else order[::-1]:
                if step >= counts[arm]:
                    continue
                if awake != arm:
                    calls += ([(awake, "sleep level 1")] if awake is not None else []) + [(arm, "wake_up")]
                    awake = arm
                if calls[-1] != (arm, "probe"):
                    calls.append((arm, "probe"))
    return calls


def test_the_engines_take_turns_and_each_step_probes_both_at_one_load(tmp_path, tiny_model, request):
    launch = StandIns(tmp_path)
    request.addfinalizer(launch.stop)
    spec = _spec(tmp_path, tiny_model)
    outcome = run_paired(spec, launch=launch)
    calls = launch.calls()
    assert launch.stopped(), "both engines stopped once the pairing ended"
    assert outcome.fallback is None and len(outcome.rounds) == 2
    # Launched and put to sleep one after the other; then, step by step (three a round where every probe passes),
    # arm 0 first in round 1, arm 1 first in round 2, the order reversed at each step, so that the engine awake goes
    # on: A B, B A, A B; B A, A B, B A.
    assert calls == _taking_turns([tuple(len(o.probes) for o in r) for r in outcome.rounds]), calls
    assert calls[2:9] == [(0, "wake_up"), (0, "probe"), (0, "sleep level 1"), (1, "wake_up"), (1, "probe"),
                          (1, "sleep level 1"), (0, "wake_up")], "A, then B twice in a row, then A"
    for round_outcomes in outcome.rounds:
        # Each step probes both arms at one load, while their verdicts agree: on a crowded machine a stand-in may
        # fail a pace rule, and that arm's search goes its own way from there (the stand-in keeps up otherwise:
        # 1, 2 and 4 times the reference).
        runs = [o.probes for o in round_outcomes]
        for a, b in zip(*runs):
            assert a.probe.factor == b.probe.factor, [[r.probe.factor for r in arm] for arm in runs]
            if judge_probe(a.probe, a.records, PLAN.boundary).verdict != \
                    judge_probe(b.probe, b.records, PLAN.boundary).verdict:
                break
        assert all(arm[0].probe.factor == 1.0 for arm in runs)
        for arm, o in enumerate(round_outcomes):
            assert o.record.failure is None and o.record.engine_config == _config(arm)
            assert all(r.outcome is Outcome.OK for run in o.probes for r in run.records), "none met a sleeping engine"
            # Startup: the launch (first round) and three wake-ups; teardown: the sleeps, and the stop at the end.
            assert o.record.timings.startup_s > 0 and o.record.timings.replay_s > 0 and o.record.timings.teardown_s > 0
            assert o.record.argv == launch.engines[arm].argv
    first, second = outcome.rounds[0][0].record.timings, outcome.rounds[1][0].record.timings
    assert first.startup_s >= launch.engines[0].startup_s > second.startup_s, "the launch counts in round 1 alone"
    # Each arm's round is written as a launch's trial is, the engine's whole log beside it.
    for trial in range(4):
        folder = tmp_path / f"trial-{trial}"
        assert {p.name for p in folder.iterdir()} >= {"server.log", "measurement.json", "requests.csv", "timeline.csv"}
        ran = outcome.rounds[trial // 2][trial % 2].probes
        assert len(json.loads((folder / "measurement.json").read_text())["probes"]) == len(ran)


def test_a_second_engine_without_room_ends_the_pairing_with_the_first_stopped(tmp_path, tiny_model, request):
    refused = EngineLaunchError(classify_failure(1, NO_ROOM), 40.0, time.time())
    launch = StandIns(tmp_path, {1: refused})
    request.addfinalizer(launch.stop)
    outcome = run_paired(_spec(tmp_path, tiny_model), launch=launch)
    assert outcome.rounds == () and launch.stopped() and len(launch.engines) == 1
    assert outcome.fallback.startswith("engine 2 of 2 did not start with sleep mode while engine 1 slept (load_oom: "
                                       "Free memory on device cuda:0"), outcome.fallback


def test_a_refused_sleep_ends_the_pairing_before_any_probe(tmp_path, tiny_model, request):
    launch = StandIns(tmp_path, {0: ["--refuse-sleep"]})
    request.addfinalizer(launch.stop)
    outcome = run_paired(_spec(tmp_path, tiny_model), launch=launch)
    assert outcome.rounds == () and launch.stopped() and len(launch.engines) == 1
    assert outcome.fallback == "POST /sleep?level=1 is not served (vLLM serves it with VLLM_SERVER_DEV_MODE=1)"


def test_a_wake_up_refused_mid_way_keeps_the_rounds_run_in_full(tmp_path, tiny_model, request):
    # Engine 2's third wake-up is its first of round 2 (A B, B A, A B; then B, awake, goes on, and is woken again in
    # the second step): round 1 stands, round 2 is for interleaved launches.
    launch = StandIns(tmp_path, {1: ["--fail-wake", "3"]})
    request.addfinalizer(launch.stop)
    outcome = run_paired(_spec(tmp_path, tiny_model), launch=launch)
    calls = launch.calls()
    assert launch.stopped() and len(outcome.rounds) == 1
    assert outcome.fallback.startswith("POST /wake_up answered 500: "), outcome.fallback
    assert calls[-1] == (1, "wake_up refused") and (0, "probe") not in calls[calls.index((1, "wake_up refused")):]


def test_an_unexpected_error_still_stops_every_engine(tmp_path, tiny_model, request):
    launch = StandIns(tmp_path, {1: RuntimeError("the worker's own error")})
    request.addfinalizer(launch.stop)
    with pytest.raises(RuntimeError, match="the worker's own error"):
        run_paired(_spec(tmp_path, tiny_model), launch=launch)
    assert len(launch.engines) == 1 and launch.stopped()


def test_the_runner_concludes_each_arms_round_as_a_paired_validation_launch(tmp_path, tiny_model, monkeypatch,
                                                                            request):
    """The driver's side: a study's A/A check validated paired, each arm's round asked of Optuna, run in one job and
    concluded as a launch, marked paired and judged so. Stand-ins for what cannot run here: a GPU slot (this machine
    and its Ray slots have none) and the Ray job's launches (sleep-mode engines; the same `run_paired` runs, in this
    process, against tests/sleep_server.py)."""
    from tuner.study import launch_time, paired_validation
    from tuner.study import runner as runner_module
    from tuner.workers import pool as pool_module

    url, artifacts = f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts"
    run_tuner("study", "create", "aa", "--model", str(tiny_model), "--trace", str(AZURE_CONV), *SEARCHED,
              "--storage", url, "--artifacts", str(artifacts))
    plan = storage_plan(url, artifacts)
    runner = runner_module.StudyRunner("aa", plan, parallel=1)
    machine = detect_hardware()
    with_gpu = dataclasses.replace(machine, accelerator="cuda", gpu_count=1)
    for module in (runner_module, launch_time, paired_validation):  # each asks for the machine's GPUs
        monkeypatch.setattr(module, "detect_hardware", lambda: with_gpu)
    # The baseline queued at creation runs first, unpaired: the decision says so and launches nothing.
    assert runner.clock.pairing(2, 4, 1, True, None, None).text == \
        "interleaved launches: trials queued before the validation run first"
    queued = runner.opened.study.ask()  # set aside without a launch, so that only the validation's launches are queued
    runner.opened.study.tell(queued, state=OptunaState.FAIL)

    pool_init = pool_module.WorkerPool.__init__

    def gpu_slots(pool, *args, **kwargs) -> None:
        pool_init(pool, *args, **kwargs)
        pool.slots = [dataclasses.replace(slot, gpus=1) for slot in pool.slots]

    launch = StandIns(tmp_path)
    request.addfinalizer(launch.stop)
    jobs: list[PairedSpec] = []

    def here(pool, slot: int, spec: PairedSpec, stop_reason, poll_s: float) -> pool_module.PairedResult:
        jobs.append(spec)
        outcome = run_paired(spec, launch=launch)
        return pool_module.PairedResult(tuple(tuple(pool_module.WorkerResult(o, {}, "here", slot) for o in r)
                                              for r in outcome.rounds), outcome.fallback)

    monkeypatch.setattr(pool_module.WorkerPool, "__init__", gpu_slots)
    monkeypatch.setattr(pool_module.WorkerPool, "run_paired", here)
    validation, report = runner.validate(1, 2, against_itself=True)
    stored = {t.trial_number: t for t in runner.opened.repo.trials("aa")}

    assert len(jobs) == 1 and len(launch.engines) == 2 and launch.stopped(), "one job, one engine per arm"
    assert [(s.validation.round, s.validation.arm, s.validation.paired, s.state.value) for s in report.trials] == \
        [(1, 0, True, "complete"), (1, 1, True, "complete"), (2, 0, True, "complete"), (2, 1, True, "complete")]
    # Each arm's round ran the load search a validation launch runs: twice the study's budget, the reference load
    # first, then, where it passed, the highest load allowed. (Where a crowded machine delays the stand-in, the pace
    # rules may fail a probe, and the search goes its other way: its verdicts, not the factors, are the stand-in's.)
    assert all(spec.load.policy.probe_budget == 4 for specs in jobs[0].rounds for spec in specs)
    for s in report.trials:
        probes = stored[s.number].probes
        assert len(probes) <= 4 and probes[0].probe.factor == 1.0, [(p.probe.factor, p.reasons) for p in probes]
        if probes[0].verdict == Verdict.PASS:
            assert probes[1].probe.factor == 2.0, [(p.probe.factor, p.reasons) for p in probes]
    assert validation.paired and validation.complete and validation.gain.paired
    assert validation.design == "paired on one engine pair with sleep mode"
    assert validation.verdict().splitlines()[1] == "paired on one engine pair with sleep mode"
    assert all(stored[s.number].validation.paired and stored[s.number].timings.startup_s > 0 for s in report.trials)
    assert all((trial_dir(plan.artifact_dir, "aa", s.number) / "measurement.json").is_file() for s in report.trials)


def _on_a_gpu_slot(monkeypatch) -> None:
    """What cannot run here, stood in for: this machine and its Ray slots with a GPU."""
    from tuner.study import launch_time, paired_validation
    from tuner.study import runner as runner_module
    from tuner.workers import pool as pool_module

    with_gpu = dataclasses.replace(detect_hardware(), accelerator="cuda", gpu_count=1)
    for module in (runner_module, launch_time, paired_validation):  # each asks for the machine's GPUs
        monkeypatch.setattr(module, "detect_hardware", lambda: with_gpu)
    pool_init = pool_module.WorkerPool.__init__

    def gpu_slots(pool, *args, **kwargs) -> None:
        pool_init(pool, *args, **kwargs)
        pool.slots = [dataclasses.replace(slot, gpus=1) for slot in pool.slots]

    monkeypatch.setattr(pool_module.WorkerPool, "__init__", gpu_slots)


def test_a_budget_run_opens_with_its_queued_pair_and_validates_on_the_same_engines(tmp_path, tiny_model,
                                                                                  monkeypatch, request):
    """A run under a budget whose queue opens with vLLM's default and one more configuration (as the precision
    check is queued) runs the two as the first round of paired engines; where the budget then leaves no search
    trial, the validation's rounds go on on those engines, and no engine starts again. Stand-ins as above, and the
    slot's worker (`TrialWorker`, the same code Ray runs) in this process; each stand-in takes 30 s to start, as a
    cold GPU engine takes minutes, so that the budget holds the validation on held engines and not on new ones."""
    from tuner.study.budget import RunBudget
    from tuner.study.create import enqueue_config
    from tuner.study.events import BUDGET_KEPT
    from tuner.study.paired_validation import ON_THE_OPENING_PAIR
    from tuner.study.runner import StudyRunner
    from tuner.validation import PAIRED
    from tuner.workers import pool as pool_module
    from tuner.workers.paired import EnginePair

    url, artifacts = f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts"
    run_tuner("study", "create", "pair", "--model", str(tiny_model), "--trace", str(AZURE_CONV), *SEARCHED,
              "--storage", url, "--artifacts", str(artifacts))
    plan = storage_plan(url, artifacts)
    enqueue_config("pair", plan, _config(1))  # queued beside the baseline, as the precision check is
    _on_a_gpu_slot(monkeypatch)
    launch = StandIns(tmp_path, startup_s=30.0)
    request.addfinalizer(launch.stop)
    monkeypatch.setattr(pool_module, "EnginePair", functools.partial(EnginePair, launch=launch))
    workers: list[pool_module.TrialWorker] = []
    kept: list[bool] = []

    def here(pool, slot: int, spec: PairedSpec, stop_reason, poll_s: float, keep: bool = False):
        if not workers:
            workers.append(pool_module.TrialWorker(pool.slots[slot], pool._driver_node))
        kept.append(keep)
        return workers[0].run_paired(spec, keep)

    monkeypatch.setattr(pool_module.WorkerPool, "run_paired", here)
    monkeypatch.setattr(pool_module.WorkerPool, "release_pair", lambda pool, slot: workers[0].release_pair())
    runner = StudyRunner("pair", plan, parallel=1)
    request.addfinalizer(runner.close)
    # 200 s: the opening pair (two 30 s starts, four probes of about 5 s) and the validation's four launches on its
    # engines (three probes each, as planned) fit; a search trial (a 30 s start, two probes) and a validation on new
    # engines (two more starts) do not. So from probes of 3 to 8 s.
    budget = RunBudget(time.time(), 200.0, None, validation_launches=4, validation_arms=2)

    report = runner.run(None, budget=budget)
    assert [(s.number, s.state.value, s.validation) for s in report.trials] == [(0, "complete", None),
                                                                                (1, "complete", None)]
    assert report.stopped_early == BUDGET_KEPT, report.stopped_early
    assert len(launch.engines) == 2 and not launch.stopped(), "both engines held, asleep, for the validation"
    validation, checked = runner.validate(1, 2, budget=budget)
    runner.close()

    assert kept == [True, False] and len(launch.engines) == 2 and launch.stopped(), (validation.design, checked)
    assert [(s.validation.round, s.validation.arm, s.validation.of_trial, s.validation.paired, s.state.value)
            for s in checked.trials] == [(1, 0, None, True, "complete"), (1, 1, 1, True, "complete"),
                                         (2, 0, None, True, "complete"), (2, 1, 1, True, "complete")]
    assert validation.complete and validation.paired and validation.design == PAIRED + ON_THE_OPENING_PAIR
    # The opening round, then the validation's two, on the same two engines taking turns throughout.
    stored = {t.trial_number: t for t in runner.opened.repo.trials("pair")}
    rounds = [(0, 1), (2, 3), (4, 5)]
    assert launch.calls() == _taking_turns([(len(stored[a].probes), len(stored[b].probes)) for a, b in rounds])
    # The launch counts in the opening trials alone; the validation's launches woke engines that were up.
    assert stored[0].timings.startup_s >= 30 and stored[1].timings.startup_s >= 30
    assert all(stored[n].timings.startup_s < 30 and stored[n].timings.sleep_s > 0 for n in range(2, 6))


@pytest.mark.vllm
def test_on_vllms_cpu_build_the_paired_job_reaches_a_ray_worker_and_falls_back_at_its_first_launch(tiny_model,
                                                                                                   tmp_path):
    # The paired job as a validation sends it, through Ray to the slot's worker, on real vLLM: the CPU build refuses
    # --enable-sleep-mode at startup, so the job ends at its first launch with that reason and no round, and the
    # driver goes on with interleaved launches (the stand-ins above show what it does where sleep mode serves).
    from tuner.workers.pool import PairedResult, WorkerPool

    spec = PairedSpec(((TrialSpec(tiny_model, TRACE, _config(0), tmp_path / "trial-0", startup_timeout_s=300,
                                  request_timeout_s=30, load=PLAN),
                        TrialSpec(tiny_model, TRACE, _config(1), tmp_path / "trial-1", startup_timeout_s=300,
                                  request_timeout_s=30, load=PLAN)),))
    with WorkerPool(1) as pool:
        result = pool.run_paired(0, spec, lambda: None, 1.0)
    assert isinstance(result, PairedResult) and result.rounds == (), result
    assert result.fallback is not None and result.fallback.startswith("engine 1 of 2 did not start with sleep mode ("),\
        result.fallback
    log = (tmp_path / "trial-0" / "server.log").read_text()
    assert "Sleep mode is not supported on current platform" in log, log[-2000:]
    assert not (tmp_path / "trial-1" / "server.log").exists()  # the second engine was never launched
