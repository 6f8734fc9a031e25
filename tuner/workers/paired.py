"""Paired validation on one GPU: one engine per arm (vLLM's default and the finalist), launched once each with vLLM's
sleep mode, taking turns. In each round, for each step of the arms' load searches, every arm in turn is warmed up and
probed at its search's next load, so the arms' probes of a step run back to back, seconds apart, and a drift of the
machine hits both. The steps alternate the arms' order (A B, B A): the engine that probed last goes first in the next
step, still awake, so a sleep and a wake-up come every other probe.

What vLLM 0.24 offers, as its code says (the GPU build; docs/validation.md has the details):

- `--enable-sleep-mode` (vllm/engine/arg_utils.py), refused where `Platform.is_sleep_mode_available` is False
  (vllm/platforms/interface.py: CUDA, ROCm and XPU only; the CPU build has none), turns on the cumem allocator that
  the weights and the KV cache are allocated through (vllm/config/model.py, vllm/v1/worker/gpu_worker.py).
- `POST /sleep?level=1`, `POST /wake_up`, `GET /is_sleeping` (vllm/entrypoints/serve/dev/sleep/api_router.py), mounted
  only with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/openai/api_server.py); each answers once the engine is done.
- Level 1 aborts what is in flight, resets the prefix cache (`EngineCore.sleep` pauses the scheduler with
  clear_cache), copies the weights to pinned CPU memory and drops the KV cache (vllm/device_allocator/cumem.py). The
  CUDA graphs, the CUDA context and what else PyTorch allocated stay on the GPU.
- An engine starts only where the GPU has `gpu_memory_utilization` of its memory free (`request_memory`,
  vllm/v1/worker/utils.py), and sizes its KV cache from that share, not from what is free: so every engine is launched
  while the others sleep, and gets the KV cache it would get alone.

The rounds' records are those of launches (`trial_record`), each with the probes of its round: its startup is the
engine's launch (first round) and its wake-ups, its replay the warm-ups and probes, its teardown its sleeps and, in
the last round, the engine's stop. An engine held between calls (`EnginePair.run_rounds` with keep) stays as it is,
one of them awake.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

from tuner.common.hardware import HardwareInfo, detect_hardware
from tuner.common.models import inspect_model
from tuner.workers.compile_cache import compile_cache_state
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import EngineFailure
from tuner.workers.launch import EngineLaunchError, RunningEngine, read_log, start_engine
from tuner.workers.measure import TrialTimings
from tuner.workers.probes import LoadPlan, ProbeRun, run_probes
from tuner.workers.trial import TrialOutcome, TrialSpec, died_during, trial_record, write_artifacts

SLEEP_MODE_FLAG = "--enable-sleep-mode"
# vLLM mounts /sleep, /wake_up and /is_sleeping only in its development mode.
SLEEP_ENDPOINTS_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
# Level 1 keeps the weights (in CPU memory) for the wake-up; level 2 would have to reload them.
SLEEP_LEVEL = 1
# A level-1 sleep copies the engine's weights to host memory: on an H100 (2026-12-07) 15.0 GiB took 12.4 s and
# 8.5 GiB 7.6 s, about 1.2 GiB/s; the wake-up, 0.6 s, is left out.
SLEEP_COPY_BYTES_PER_S = 1.2 * 2**30


class SleepModeRefused(Exception):
    """An engine did not go to sleep or wake up when asked: the pairing cannot go on."""


@dataclass(frozen=True)
class PairedSpec:
    """A paired validation: each round's trials, one per arm in the arms' order (`rounds[r][arm]`). An arm's engine
    is launched from its first round's spec (configuration, flags, environment, timeouts, log in its folder); each
    round's spec brings its own load plan and folder."""

    rounds: tuple[tuple[TrialSpec, ...], ...]


@dataclass(frozen=True)
class PairedOutcome:
    """The rounds run in full (`rounds[r][arm]`, each a launch's outcome), and why the rest could not run paired
    (None when every round ran): those are for interleaved launches to measure."""

    rounds: tuple[tuple[TrialOutcome, ...], ...]
    fallback: str | None


def round_order(arms: int, round_number: int) -> list[int]:
    """The order the arms take their turns in, in each step of round `round_number` (from 1): as given in odd rounds,
    reversed in even ones, so that no arm always probes right after the other."""
    order = list(range(arms))
    return order if round_number % 2 else order[::-1]


@dataclass(frozen=True)
class OneStep:
    """A load plan run one probe at a time: the probe `plan` asks for after the `done` probes it has, then none."""

    plan: LoadPlan
    done: int

    @property
    def warmup_requests(self) -> int:
        """The plan's warm-up, before each probe: the engine was asleep, its KV cache dropped."""
        return self.plan.warmup_requests

    @property
    def min_requests(self) -> int:
        """The plan's requests per probe."""
        return self.plan.min_requests

    @property
    def min_span_s(self) -> float:
        """The plan's least probe duration."""
        return self.plan.min_span_s

    def next_factor(self, runs: Sequence[ProbeRun]) -> float | None:
        """The plan's next load once, after its `done` probes."""
        return self.plan.next_factor(runs) if len(runs) == self.done else None


def expected_sleep_s(weight_bytes: int) -> float:
    """How long a level-1 sleep of an engine holding `weight_bytes` of weights is expected to take."""
    return weight_bytes / SLEEP_COPY_BYTES_PER_S


@functools.cache
def sleep_mode_served() -> bool:
    """Whether the installed vLLM's server declares the sleep endpoints (a `"/sleep"` route among its entrypoints),
    read without importing vLLM, as `launch.per_request_metrics_supported` reads its flags."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and declares_sleep_route(spec.submodule_search_locations or ())


def declares_sleep_route(package_dirs: Iterable[str | Path]) -> bool:
    """Whether the vLLM package at one of these folders routes `"/sleep"` in its entrypoints (0.24:
    entrypoints/serve/dev/sleep/api_router.py)."""
    for root in package_dirs:
        for path in sorted((Path(root) / "entrypoints").rglob("*.py")):
            try:
                if '"/sleep"' in path.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def launch_with_sleep_mode(spec: TrialSpec) -> RunningEngine:
    """vLLM for `spec`'s configuration, with sleep mode and its endpoints, logging into its folder's server.log."""
    return start_engine(spec.model, spec.config, spec.out_dir / "server.log", startup_timeout_s=spec.startup_timeout_s,
                        extra_args=[*spec.extra_args, SLEEP_MODE_FLAG], env={**spec.env, **SLEEP_ENDPOINTS_ENV})


def _post(engine: RunningEngine, path: str, timeout_s: float) -> None:
    try:
        response = httpx.post(f"{engine.base_url}{path}", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise SleepModeRefused(f"POST {path} got no answer: {exc.__class__.__name__}") from None
    if response.status_code == 404:
        raise SleepModeRefused(f"POST {path} is not served (vLLM serves it with VLLM_SERVER_DEV_MODE=1)")
    if response.status_code != 200:
        raise SleepModeRefused(f"POST {path} answered {response.status_code}: {response.text[:300]}")


def _asleep(engine: RunningEngine) -> bool | None:
    """What GET /is_sleeping says; None where it says nothing readable."""
    try:
        return bool(httpx.get(f"{engine.base_url}/is_sleeping", timeout=30.0).json()["is_sleeping"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def put_to_sleep(engine: RunningEngine, timeout_s: float) -> float:
    """POST /sleep at level 1 and check that the engine says it sleeps; the seconds it took. SleepModeRefused where
    it did not."""
    started = time.monotonic()
    _post(engine, f"/sleep?level={SLEEP_LEVEL}", timeout_s)
    if _asleep(engine) is not True:
        raise SleepModeRefused("POST /sleep answered, but GET /is_sleeping does not say it sleeps")
    return time.monotonic() - started


def wake_up(engine: RunningEngine, timeout_s: float) -> float:
    """POST /wake_up (every tag: weights and KV cache) and check that the engine says it is awake; the seconds it
    took. SleepModeRefused where it did not (no room on the GPU for its memory, say)."""
    started = time.monotonic()
    _post(engine, "/wake_up", timeout_s)
    if _asleep(engine) is not False:
        raise SleepModeRefused("POST /wake_up answered, but GET /is_sleeping does not say it is awake")
    return time.monotonic() - started


@dataclass
class _ArmRound:
    """One arm's round as it goes: when it began, where its time went, its probes, and the engine's death if it died."""

    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    startup_s: float = 0.0
    replay_s: float = 0.0
    teardown_s: float = 0.0
    sleep_s: float = 0.0  # of the teardown, the sleeps
    runs: list[ProbeRun] = field(default_factory=list)
    failure: EngineFailure | None = None

    def slept(self, seconds: float) -> None:
        """A sleep of the engine, counted in the teardown."""
        self.teardown_s += seconds
        self.sleep_s += seconds


class EnginePair:
    """One engine per arm on one GPU, launched with sleep mode from the arms' first specs, each put to sleep before
    the next starts, and held between calls of `run_rounds` until it stops them: a study's opening pair
    (`tuner.study.paired_validation.open_pair`) keeps its engines for the validation's rounds that follow."""

    def __init__(self, first: Sequence[TrialSpec],
                 launch: Callable[[TrialSpec], RunningEngine] = launch_with_sleep_mode):
        self.first = tuple(first)
        self.launch = launch
        self.engines: list[RunningEngine] = []
        self.rounds_run = 0  # each round's arm order follows from its number (`round_order`)
        self.vocab_size = inspect_model(self.first[0].model).vocab_size
        self.hardware = detect_hardware()
        self._launched: list[_ArmRound] = []  # each arm's launch and first sleep, counted in its first round
        self.awake: int | None = None  # the arm whose engine is awake; the others sleep

    def start(self) -> str | None:
        """Launch the engines one after the other, each put to sleep; why the pairing cannot go on where one did not
        start or sleep (then every engine started is stopped), else None. On any error every engine is stopped."""
        try:
            for arm, arm_spec in enumerate(self.first):
                current = _ArmRound()
                try:
                    engine = self.launch(arm_spec)
                except EngineLaunchError as exc:
                    asleep = ", ".join(str(k + 1) for k in range(arm))
                    beside = f" while engine{'s' if arm > 1 else ''} {asleep} slept" if arm else ""
                    self.stop()
                    return (f"engine {arm + 1} of {len(self.first)} did not start with sleep mode{beside} "
                            f"({exc.failure.kind.value}: {exc.failure.message})")
                self.engines.append(engine)
                current.startup_s = engine.startup_s
                current.slept(put_to_sleep(engine, arm_spec.startup_timeout_s))
                self._launched.append(current)
        except SleepModeRefused as exc:
            self.stop()
            return str(exc)
        except BaseException:
            self.stop()
            raise
        return None

    def run_rounds(self, rounds: Sequence[Sequence[TrialSpec]], *, keep: bool = False) -> PairedOutcome:
        """Run `rounds` (`_probe_round`) on the engines, then stop them, unless `keep` and every round ran in full
        (then they sleep, for more rounds). A sleep or wake-up that fails, or an engine that dies before the last
        round, ends the pairing: the rounds run in full come back, with the reason. Each round's files are written in
        its spec's folder."""
        done: list[tuple[Sequence[TrialSpec], list[_ArmRound]]] = []
        fallback = None
        try:
            for specs in rounds:
                self.rounds_run += 1
                number = self.rounds_run
                arm_rounds = self._launched if number == 1 else [_ArmRound() for _ in specs]
                self._probe_round(specs, arm_rounds, round_order(len(specs), number))
                done.append((specs, arm_rounds))
                dead = [arm for arm, a in enumerate(arm_rounds) if a.failure is not None]
                if dead and (keep or len(done) < len(rounds)):
                    failure = arm_rounds[dead[0]].failure
                    assert failure is not None
                    fallback = f"engine {dead[0] + 1} died in round {number} ({failure.kind.value})"
                    break
        except SleepModeRefused as exc:
            fallback = str(exc)
        finally:
            if not keep or fallback is not None or len(done) < len(rounds):
                stopped = self.stop()
                if done:
                    for arm_round, stop_s in zip(done[-1][1], stopped):
                        arm_round.teardown_s += stop_s
        return PairedOutcome(tuple(tuple(_outcome(specs[arm], arm_round, self.engines[arm], self.first[arm],
                                                  self.hardware) for arm, arm_round in enumerate(arm_rounds))
                                   for specs, arm_rounds in done), fallback)

    def _probe_round(self, specs: Sequence[TrialSpec], arm_rounds: Sequence[_ArmRound], order: list[int]) -> None:
        """One round: step by step, each arm whose search asks for another load (and whose engine lives) is probed
        once, warmed up first, until no search asks for more. The steps take the arms in `order`, then reversed, and
        so on (A B, B A, A B): the arm that probed last in a step goes first in the next, so the engine awake stays
        awake, and only every other probe costs a sleep and a wake-up (`_turn`)."""
        step = 0
        while True:
            stepped = False
            for arm in order if step % 2 == 0 else order[::-1]:
                spec, current = specs[arm], arm_rounds[arm]
                if current.failure is not None or spec.load.next_factor(current.runs) is None:
                    continue
                stepped = True
                self._turn(arm, specs, arm_rounds)
                engine = self.engines[arm]
                started = time.monotonic()
                current.runs = run_probes(engine, spec.trace, self.vocab_size, OneStep(spec.load, len(current.runs)),
                                          seed=spec.seed, request_timeout_s=spec.request_timeout_s,
                                          stop_rule=spec.stop_rule, verdict_rule=spec.verdict_rule,
                                          earlier=current.runs)
                current.replay_s += time.monotonic() - started
                if died_during(engine, current.runs):
                    current.failure = engine.failure()
                    self.awake = None
            if not stepped:
                return
            step += 1

    def _turn(self, arm: int, specs: Sequence[TrialSpec], arm_rounds: Sequence[_ArmRound]) -> None:
        """Make `arm`'s engine the one awake: the engine awake, if another, put to sleep (its sleep counted in its
        round, or the next one it probes in where it has none here), then `arm`'s woken."""
        if self.awake == arm:
            return
        if self.awake is not None:
            other = self.awake
            arm_rounds[other].slept(put_to_sleep(self.engines[other], specs[other].startup_timeout_s))
            self.awake = None
        arm_rounds[arm].startup_s += wake_up(self.engines[arm], specs[arm].startup_timeout_s)
        self.awake = arm

    @property
    def configs(self) -> tuple[EngineConfig, ...]:
        """The arms' configurations, in the arms' order."""
        return tuple(spec.config for spec in self.first)

    def stop(self) -> list[float]:
        """Stop every engine (each `RunningEngine.stop` is idempotent); the seconds each took."""
        return [engine.stop() for engine in self.engines]


def run_paired(spec: PairedSpec, *, launch: Callable[[TrialSpec], RunningEngine] = launch_with_sleep_mode,
               pair: EnginePair | None = None, keep: bool = False) -> PairedOutcome:
    """Run the rounds of `spec` paired: on `pair`'s engines (launched for the arms' first round where not yet, by
    `EnginePair.start`; none launched for other configurations) or on a new pair's; then stop every engine on every
    path, before this returns, unless `keep` and every round ran (`EnginePair.run_rounds`). A launch, sleep or
    wake-up that fails ends the pairing: the rounds run in full come back, with the reason. Each round's files are
    written in its spec's folder."""
    pair = pair or EnginePair(spec.rounds[0], launch)
    if not pair.engines:
        fallback = pair.start()
    elif pair.configs != tuple(s.config for s in spec.rounds[0]):
        pair.stop()
        fallback = "the engines held were launched for other configurations"
    else:
        fallback = None
    if fallback is not None:
        return PairedOutcome((), fallback)
    return pair.run_rounds(spec.rounds, keep=keep)


def _outcome(spec: TrialSpec, arm_round: _ArmRound, engine: RunningEngine, first: TrialSpec,
             hardware: HardwareInfo) -> TrialOutcome:
    """An arm's round as a launch's outcome, its files in its folder: the engine's whole log (it ran every round)
    beside its round's records."""
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    log = first.out_dir / "server.log"
    if spec.out_dir != first.out_dir and log.exists():
        shutil.copyfile(log, spec.out_dir / "server.log")
    timings = TrialTimings(arm_round.startup_s, arm_round.replay_s, arm_round.teardown_s,
                           compile_cache_state(read_log(log)), arm_round.sleep_s)
    record = trial_record(spec, hardware, arm_round.started_at, timings, runs=arm_round.runs,
                          failure=arm_round.failure, argv=engine.argv)
    outcome = TrialOutcome(record, arm_round.runs, engine.launched_at)
    write_artifacts(outcome, spec.out_dir)
    return outcome
