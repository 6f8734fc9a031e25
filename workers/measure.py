"""From raw replay results to the measurement record a score is computed from."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields

from tuner.hardware import HardwareInfo
from tuner.traces.stats import percentile
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import EngineFailure
from tuner.workers.replay import Outcome, ReplayResult, RequestRecord
from tuner.workers.server_metrics import (INFERENCE_TIME, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, QUEUE_TIME,
                                    Histogram)


@dataclass(frozen=True)
class Percentiles:
    """p50, p95 and p99 of some figure over a replay's requests; None where no request gave it."""

    p50: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        if not values:
            return cls(None, None, None)
        return cls(percentile(values, 50), percentile(values, 95), percentile(values, 99))


@dataclass(frozen=True)
class TrialTimings:
    """Where one trial's time went, in seconds."""

    startup_s: float
    replay_s: float
    teardown_s: float

    @property
    def total_s(self) -> float:
        return self.startup_s + self.replay_s + self.teardown_s

    def to_dict(self) -> dict:
        """The three phases and their total."""
        return {**asdict(self), "total_s": self.total_s}

    @classmethod
    def from_dict(cls, data: dict) -> TrialTimings:
        """The timings `to_dict` gave (the total is computed again, not read)."""
        return cls(data["startup_s"], data["replay_s"], data["teardown_s"])


@dataclass(frozen=True)
class Measurement:
    """What users experienced in one trial, and what vLLM saw while it happened."""

    requests: int
    completed: int  # streamed to the end with every requested token
    failed: int  # every other outcome
    outcomes: dict[str, int]
    duration_s: float  # replay, first due send to last response
    completed_rps: float
    output_tps: float
    ttft_s: Percentiles
    e2e_s: Percentiles
    queue_s_p50: float | None  # from vLLM's histogram: waiting before scheduling
    queue_s_p95: float | None
    queue_s_mean: float | None
    inference_s_mean: float | None  # from vLLM's histogram: scheduled until finished
    preemptions: int
    preemptions_per_100: float
    running_peak: float
    running_mean: float
    waiting_peak: float
    waiting_mean: float
    kv_usage_peak: float
    prefix_cache_hit_rate: float | None
    requested_output_tokens: int
    actual_output_tokens: int
    send_lateness_s: Percentiles  # how late requests left against their schedule (replayer fidelity)
    metrics_available: bool  # False when the server was gone before its counters could be read

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        """The measurement `to_dict` gave, its percentiles records again."""
        return cls(**{**data, **{name: Percentiles(**data[name]) for name in _PERCENTILE_FIELDS}})


_PERCENTILE_FIELDS = tuple(f.name for f in fields(Measurement) if f.type == "Percentiles")


def _hist_delta(result: ReplayResult, name: str) -> Histogram | None:
    if result.metrics_before is None or result.metrics_after is None:
        return None
    return result.metrics_after.histogram(name).minus(result.metrics_before.histogram(name))


def _counter_delta(result: ReplayResult, name: str) -> float | None:
    if result.metrics_before is None or result.metrics_after is None:
        return None
    return result.metrics_after.value(name) - result.metrics_before.value(name)


def measure(result: ReplayResult) -> Measurement:
    """What the replay's requests and vLLM's metrics (before, after and sampled during it) add up to."""
    records: list[RequestRecord] = result.records
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
    ok = [r for r in records if r.outcome is Outcome.OK]
    finished = [r for r in records if r.outcome in (Outcome.OK, Outcome.TRUNCATED)]
    duration = max(result.duration_s, 1e-9)
    queue = _hist_delta(result, QUEUE_TIME)
    inference = _hist_delta(result, INFERENCE_TIME)
    preemptions = _counter_delta(result, PREEMPTIONS)
    queries, hits = _counter_delta(result, PREFIX_QUERIES), _counter_delta(result, PREFIX_HITS)
    timeline = result.timeline
    running = [s.running for s in timeline] or [0.0]
    waiting = [s.waiting for s in timeline] or [0.0]
    return Measurement(
        requests=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        outcomes=outcomes,
        duration_s=result.duration_s,
        completed_rps=len(ok) / duration,
        output_tps=sum(r.output_tokens for r in finished) / duration,
        ttft_s=Percentiles.of([r.ttft_s for r in finished if r.ttft_s is not None]),
        e2e_s=Percentiles.of([r.e2e_s for r in finished if r.e2e_s is not None]),
        queue_s_p50=queue.quantile(0.5) if queue else None,
        queue_s_p95=queue.quantile(0.95) if queue else None,
        queue_s_mean=queue.mean() if queue else None,
        inference_s_mean=inference.mean() if inference else None,
        preemptions=int(preemptions or 0),
        preemptions_per_100=100.0 * (preemptions or 0) / max(len(records), 1),
        running_peak=max(running),
        running_mean=statistics.fmean(running),
        waiting_peak=max(waiting),
        waiting_mean=statistics.fmean(waiting),
        kv_usage_peak=max([s.kv_usage for s in timeline] or [0.0]),
        prefix_cache_hit_rate=(hits or 0.0) / queries if queries else None,
        requested_output_tokens=sum(r.requested_tokens for r in records),
        actual_output_tokens=sum(r.output_tokens for r in records),
        send_lateness_s=Percentiles.of([r.lateness_s for r in records if r.lateness_s is not None]),
        metrics_available=preemptions is not None,
    )


@dataclass(frozen=True)
class TrialRecord:
    """One trial, whole: what was tried, on what, against which trace, and what came of it."""

    model: str
    engine_config: EngineConfig
    serve_command: str
    trace: dict  # source, format, sha256, requests, span, transformations
    hardware: HardwareInfo
    vllm_version: str
    started_at: str  # ISO 8601, UTC
    timings: TrialTimings
    measurement: Measurement | None  # None when the engine never served
    failure: EngineFailure | None
    log_path: str
    argv: list[str] = field(default_factory=list)
    stop_reason: str | None = None  # the replay was ended early: the boundary could no longer be met

    def to_dict(self) -> dict:
        """JSON-ready, as the trial's measurement.json holds it."""
        data = asdict(self)
        data.update(engine_config=self.engine_config.to_dict(), hardware=self.hardware.to_dict(),
                    timings=self.timings.to_dict(), failure=self.failure.to_dict() if self.failure else None)
        return data
