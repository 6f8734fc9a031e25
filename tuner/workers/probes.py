"""Load probes on one running engine: the trial's trace replayed at one rate after another, each a full
measurement, with a warm-up first and an idle engine before each.

Which rates are probed is not decided here: a `LoadPlan` (the scoring layer's load search, or one fixed load)
chooses each next rate from the probes so far.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from tuner.common.durations import format_duration
from tuner.traces.records import Trace
from tuner.traces.transforms import cap_requests, repeat, scale_rate
from tuner.workers.launch import SERVED_MODEL_NAME, RunningEngine
from tuner.workers.measure import Measurement, measure
from tuner.workers.replay import LiveReplay, Stop, prepare_requests, replay
from tuner.workers.request_record import Outcome, RequestRecord
from tuner.workers.server_metrics import RUNNING, SCRAPE_ERRORS, WAITING, TimelineSample, scrape

# Seeds of the prompts: probe k uses seed + k * PROBE_SEED_STRIDE (so probe 0 replays exactly what a single
# replay of the same seed would), the warm-up one of its own.
PROBE_SEED_STRIDE = 1_000_003
WARMUP_SEED_OFFSET = 999_983
IDLE_POLL_S = 0.2


@dataclass(frozen=True)
class Probe:
    """One replay of the trial's trace at one rate, on the trial's engine."""

    index: int  # 0 for the first probe of the trial
    factor: float  # arrival rate against the trial's trace as selected (1 = the reference load)
    seed: int  # of its prompts: fresh per probe, so that the prefix cache gives no credit from one to the next
    requests: int  # sent or due (the trace repeated until the plan's minimum size)
    measurement: Measurement | None  # None when the engine was gone before the probe could begin
    stop_reason: str | None = None  # the hopeless-trial rule ended it early
    idle_at_start: bool = True  # vLLM reported nothing running or waiting when it began
    idle_wait_s: float = 0.0  # how long it waited for that
    engine_lost: bool = False  # the engine stopped during the probe
    # Measured by an earlier launch of this configuration, this trial of the study, that was cut off before it ended
    # (tuner.workers.probe_log); None: by the launch whose probes it is listed with.
    earlier_trial: int | None = None
    # Why its verdict was a certain failure before its requests had all ended: cut there, the requests in flight
    # cancelled (Outcome.CUT). None: it ran to its end, or was stopped by the hopeless-trial rule.
    cut_by_verdict: str | None = None

    @property
    def offered_rps(self) -> float | None:
        """The probe's arrival rate in requests per second."""
        return self.measurement.offered_rps if self.measurement else None

    def to_dict(self) -> dict:
        """JSON-ready, as stored."""
        return {"index": self.index, "factor": self.factor, "seed": self.seed, "requests": self.requests,
                "measurement": self.measurement.to_dict() if self.measurement else None,
                "stop_reason": self.stop_reason, "idle_at_start": self.idle_at_start,
                "idle_wait_s": self.idle_wait_s, "engine_lost": self.engine_lost, "earlier_trial": self.earlier_trial,
                "cut_by_verdict": self.cut_by_verdict}

    @classmethod
    def from_dict(cls, data: dict) -> Probe:
        """The probe `to_dict` gave."""
        measurement = data["measurement"]
        return cls(**{**data, "measurement": Measurement.from_dict(measurement) if measurement else None})


@dataclass
class ProbeRun:
    """A probe with the per-request records and vLLM's timeline behind its measurement."""

    probe: Probe
    records: list[RequestRecord] = field(default_factory=list)
    timeline: list[TimelineSample] = field(default_factory=list)


class LoadPlan(Protocol):
    """Chooses the load of a trial's probes. It must pickle, to reach workers."""

    @property
    def warmup_requests(self) -> int:
        """Requests replayed before the first probe and kept out of every figure (0: no warm-up)."""
        ...

    @property
    def min_requests(self) -> int:
        """Each probe's trace is repeated until it holds at least this many requests (0: never repeated)."""
        ...

    @property
    def min_span_s(self) -> float:
        """...and until its arrivals last at least this long, in seconds (0: as long as the trace's)."""
        ...

    def next_factor(self, runs: Sequence[ProbeRun]) -> float | None:
        """The rate of the next probe against the trace as selected, or None when the probes so far suffice."""
        ...


@dataclass(frozen=True)
class FixedLoad:
    """One probe at the reference load: the trace replayed once, as selected, with no warm-up."""

    warmup_requests: int = 0
    min_requests: int = 0
    min_span_s: float = 0.0

    def next_factor(self, runs: Sequence[ProbeRun]) -> float | None:
        """1 for the first probe, then None."""
        return None if runs else 1.0


def probe_trace(trace: Trace, factor: float, min_requests: int, min_span_s: float) -> Trace:
    """The trace at `factor` times its rate, repeated until it holds `min_requests` requests and its arrivals last
    as long as the reference load's trace, and at least `min_span_s`: a faster probe then measures the engine over
    as long a time as the reference, and none is a burst shorter than its requests' latency."""
    scaled = scale_rate(trace, factor) if factor != 1.0 else trace
    span = max(trace.span_s, min_span_s)
    if min_requests <= len(scaled.requests) and scaled.span_s >= span:
        return scaled
    return repeat(scaled, min_requests, span)


def wait_until_idle(base_url: str, timeout_s: float) -> tuple[bool, float]:
    """Poll vLLM's gauges until it reports nothing running or waiting; (idle, seconds waited)."""
    started = time.monotonic()

    async def poll() -> bool:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() - started < timeout_s:
                try:
                    snap = await scrape(client, base_url, (RUNNING + "{", WAITING + "{"))
                    if snap.value(RUNNING) == 0 and snap.value(WAITING) == 0:
                        return True
                except SCRAPE_ERRORS:
                    return False  # the engine is going away; the probe that follows records what users see
                await asyncio.sleep(IDLE_POLL_S)
        return False

    idle = asyncio.run(poll())
    return idle, time.monotonic() - started


StopRule = Callable[[LiveReplay], str | None]  # a reason to end a replay now, or None


def _watch(stop_rule: StopRule | None, verdict_rule: StopRule | None) -> Callable[[LiveReplay], Stop | None]:
    """The stop a probe's replay polls: the hopeless-trial rule's first, then the verdict's cut."""
    def watch(live: LiveReplay) -> Stop | None:
        if stop_rule is not None and (reason := stop_rule(live)) is not None:
            return Stop(reason, Outcome.STOPPED)
        if verdict_rule is not None and (reason := verdict_rule(live)) is not None:
            return Stop(reason, Outcome.CUT)
        return None
    return watch


def run_probes(engine: RunningEngine, trace: Trace, vocab_size: int, plan: LoadPlan, *, seed: int,
               request_timeout_s: float, stop_rule: StopRule | None = None, verdict_rule: StopRule | None = None,
               on_request_done: Callable[[RequestRecord], None] | None = None,
               on_phase: Callable[[str], None] | None = None, earlier: Sequence[ProbeRun] = (),
               on_probe_done: Callable[[ProbeRun], None] | None = None) -> list[ProbeRun]:
    """Warm the engine up, then run the probes the plan asks for after the `earlier` ones (finished by an earlier
    launch of this configuration that was cut off), until it asks for none or the engine is gone. Every probe
    begins once vLLM reports nothing running or waiting (or after a wait as long as the request timeout,
    recorded), and ends early where `stop_rule` (the trial is hopeless) or `verdict_rule` (its verdict is certain)
    gives a reason. `on_probe_done` gets each probe this launch finishes."""
    phase = on_phase or (lambda _: None)
    runs = list(earlier)
    factor = plan.next_factor(runs)
    # No factor: the earlier probes settled the plan already.
    if plan.warmup_requests and factor is not None and engine.alive():
        phase("warming up")
        warmup = cap_requests(trace, plan.warmup_requests)
        asyncio.run(replay(engine.base_url, prepare_requests(warmup, vocab_size, SERVED_MODEL_NAME,
                                                             seed + WARMUP_SEED_OFFSET),
                           timeout_s=request_timeout_s, engine_alive=engine.alive, collect_metrics=False))
    while factor is not None and engine.alive():
        index = len(runs)
        probe_seed = seed + index * PROBE_SEED_STRIDE
        phase(f"waiting for an idle engine before probe {index + 1}")
        idle, waited = wait_until_idle(engine.base_url, request_timeout_s)
        probed = probe_trace(trace, factor, plan.min_requests, plan.min_span_s)
        phase(f"probe {index + 1} at x{factor:.3g} the reference load: {len(probed.requests)} requests over "
              f"{format_duration(probed.span_s)} of arrivals")
        result = asyncio.run(replay(engine.base_url, prepare_requests(probed, vocab_size, SERVED_MODEL_NAME,
                                                                      probe_seed),
                                    timeout_s=request_timeout_s, engine_alive=engine.alive,
                                    should_stop=_watch(stop_rule, verdict_rule), on_done=on_request_done))
        lost = result.engine_lost or not engine.alive()
        probe = Probe(index, factor, probe_seed, len(probed.requests), measure(result, len(trace.requests)),
                      result.stopped_as(Outcome.STOPPED), idle, waited, lost,
                      cut_by_verdict=result.stopped_as(Outcome.CUT))
        runs.append(ProbeRun(probe, result.records, result.timeline))
        if on_probe_done is not None:
            on_probe_done(runs[-1])
        if lost:
            break
        factor = plan.next_factor(runs)
    return runs
