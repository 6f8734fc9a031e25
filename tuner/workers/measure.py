"""From raw replay results to the measurement record a score is computed from."""

from __future__ import annotations

import bisect
import statistics
from dataclasses import asdict, dataclass, fields

from tuner.traces.stats import percentile
from tuner.workers.compile_cache import CompileCache
from tuner.workers.replay import ReplayResult
from tuner.workers.request_record import Outcome, RequestRecord
from tuner.workers.server_metrics import (INFERENCE_TIME, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, QUEUE_TIME,
                                          READ_METRICS, Histogram, TimelineSample)


@dataclass(frozen=True)
class Percentiles:
    """p50, p95 and p99 of some figure over a replay's requests; None where no request gave it."""

    p50: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        """The percentiles of `values`, in their unit; all None when there are none."""
        if not values:
            return cls(None, None, None)
        return cls(percentile(values, 50), percentile(values, 95), percentile(values, 99))


@dataclass(frozen=True)
class TrialTimings:
    """Where one trial's time went, in seconds."""

    startup_s: float
    replay_s: float
    teardown_s: float
    compile_cache: CompileCache = CompileCache.UNUSED  # how the engine came by its compiled graphs at startup
    # Of the teardown, the seconds a paired engine spent going to sleep (`tuner.workers.paired`); 0 for a launch
    # of its own, and in records stored before sleeps were counted apart.
    sleep_s: float = 0.0

    @property
    def total_s(self) -> float:
        """The trial's three phases together, in seconds."""
        return self.startup_s + self.replay_s + self.teardown_s

    def to_dict(self) -> dict:
        """The three phases, their total and the compile cache's state."""
        return {**asdict(self), "compile_cache": self.compile_cache.value, "total_s": self.total_s}

    @classmethod
    def from_dict(cls, data: dict) -> TrialTimings:
        """The timings `to_dict` gave (the total is computed again, not read). Records stored before the compile
        cache was read say nothing of it: unused; before sleeps were counted apart, none."""
        return cls(data["startup_s"], data["replay_s"], data["teardown_s"],
                   CompileCache(data.get("compile_cache", CompileCache.UNUSED.value)), data.get("sleep_s", 0.0))


@dataclass(frozen=True)
class Pace:
    """Whether the engine kept up with the arrivals, from the requests' own times. An engine that keeps up
    finishes the requests of the window's last two thirds in those two thirds shifted by the latency the early
    requests had (their p90); a queue that grows makes later requests slower than early ones, so they finish
    after it, and the tail drains long after the last arrival.

    A probe that repeats its trace brings the same requests, in the same order and spacing, in every span one copy
    long: an engine that keeps up serves as many requests in each such span as one copy holds, once the first
    requests have had their latency to fill it (`carried_share`). Unlike the latency of the last third against the
    first third's (`e2e_trend`), that compares like with like, so the trace's mix cannot pass for growth: the
    bundled Azure cut's late requests ask for twice the output tokens of its early ones."""

    window_s: float  # the last request's scheduled offset: how long arrivals went on
    steady_arrivals: int  # requests due in the window's last two thirds
    steady_completed: int  # requests served in full that finished inside those two thirds shifted by `lag_s`
    drain_s: float | None  # from the window's end to the last response; None when nothing finished
    e2e_trend: float | None  # median end-to-end latency of the last third of requests over the first third's
    lag_s: float = 0.0  # p90 end-to-end latency of the first third of requests
    # Median, over spans one copy of the trace long that begin after `lag_s` and end by the last arrival, of the
    # requests served in full within the span over the requests one copy holds: near 1 for an engine that keeps up,
    # its capacity over the offered load for one that does not. None for a replay of one copy, one whose arrivals
    # ended before such a span, or a record stored before it was read.
    carried_share: float | None = None

    @property
    def steady_shortfall(self) -> int:
        """Requests due in the window's last two thirds beyond those that finished in time."""
        return self.steady_arrivals - self.steady_completed

    @classmethod
    def of(cls, records: list[RequestRecord], period: int | None = None) -> Pace:
        """The pace of a replay's requests (scheduled offsets, send times and latencies). `period`: how many
        requests one copy of the trace holds when the replay repeats it (record i is then the same request as
        record i - period), None when it does not."""
        if not records:
            return cls(0.0, 0, 0, None, None)
        window = max(r.scheduled_s for r in records)
        start = window / 3
        ends = [r.sent_s + r.e2e_s for r in records if r.sent_s is not None and r.e2e_s is not None]
        served = [r.sent_s + r.e2e_s for r in records
                  if r.outcome is Outcome.OK and r.sent_s is not None and r.e2e_s is not None]
        by_schedule = sorted(records, key=lambda r: r.scheduled_s)
        third = len(by_schedule) // 3

        def e2e(part: list[RequestRecord]) -> list[float]:
            return [r.e2e_s for r in part if r.e2e_s is not None]

        early = e2e(early_requests(records))
        lag = percentile(early, 90) if early else 0.0
        first = statistics.median(early) if early else None
        late = e2e(by_schedule[-third:]) if third else []
        last = statistics.median(late) if late else None
        return cls(
            window_s=window,
            steady_arrivals=sum(start <= r.scheduled_s <= window for r in records),
            steady_completed=sum(start + lag <= end <= window + lag for end in served),
            drain_s=max(ends) - window if ends else None,
            e2e_trend=last / first if first and last is not None else None,
            lag_s=lag,
            carried_share=_carried_share(records, period, lag, window, served) if period else None,
        )


def early_requests(records: list[RequestRecord]) -> list[RequestRecord]:
    """The first third of a replay's requests by schedule (one at least): those whose p90 latency is its pace's
    yardstick (`Pace.lag_s`)."""
    return sorted(records, key=lambda r: r.scheduled_s)[:max(len(records) // 3, 1)]


# Spans at which `Pace.carried_share` counts the requests served, evenly from the first to the last.
CARRIED_SPANS = 41


def _carried_share(records: list[RequestRecord], period: int, lag_s: float, window_s: float,
                   served: list[float]) -> float | None:
    """`Pace.carried_share` of a replay whose record i is the same request as record i - period, whose arrivals
    lasted `window_s`; `served`: when each request served in full finished."""
    due = {r.index: r.scheduled_s for r in records}
    if 0 not in due or period not in due:
        return None
    copy_s = due[period] - due[0]
    first, last = lag_s + copy_s, window_s
    if first > last:
        return None
    ends = sorted(served)
    shares = [(bisect.bisect_right(ends, t) - bisect.bisect_right(ends, t - copy_s)) / period
              for t in (first + (last - first) * i / (CARRIED_SPANS - 1) for i in range(CARRIED_SPANS))]
    return statistics.median(shares)


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
    queue_s_p50: float | None  # waiting before scheduling, as vLLM saw it (`queue_source` says from what)
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
    # Measured since probes came; a measurement stored before has none of these.
    offered_rps: float | None = None  # requests / the span of their scheduled arrivals
    tpot_s: Percentiles | None = None  # of each request's mean time per output token after the first
    pace: Pace | None = None
    # Where the queue figures come from: "per_request" (each finished request's own queue time, as vLLM
    # reported it with the response) or "histogram" (vLLM's queue-time histogram, quantiles interpolated
    # inside its buckets); None when there were none, or for a measurement stored before the choice was made.
    queue_source: str | None = None
    # vLLM's gauges (running, waiting, KV usage) read from the first send to the last response: how much the peaks
    # above rest on. A busy server answers /metrics seldom, and a burst can end between two reads. None for a
    # measurement stored before it was counted.
    gauge_reads: int | None = None
    # The metrics tuner reads that vLLM's last /metrics page lacked: one a vLLM release renamed would read as 0
    # (no preemptions, an empty cache) without this. None when there was no page, or for a measurement stored
    # before it was checked.
    metrics_unreported: tuple[str, ...] | None = None
    # TTFT per 1,000 prompt tokens (`RequestRecord.ttft_per_1k_prompt_s`); None for a measurement stored before.
    ttft_per_1k_prompt_s: Percentiles | None = None
    # The fastest finished request's decode time per output token after the first, (e2e - ttft) / (tokens - 1):
    # a floor on this engine's per-token time (tuner.search.kv_traffic). From its whole decode rather than its gaps
    # between chunks, which a chunk of several tokens lengthens. None without a request of two tokens or more, or
    # for a measurement stored before.
    tpot_fastest_s: float | None = None

    def to_dict(self) -> dict:
        """As stored (the trial's `measurement` column and measurement.json): JSON-ready, nested records as dicts,
        the unreported metrics as a list, as JSON reads them back."""
        unreported = None if self.metrics_unreported is None else list(self.metrics_unreported)
        return {**asdict(self), "metrics_unreported": unreported}

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        """The measurement `to_dict` gave, its percentiles and pace records again."""
        values = {**data, **{name: Percentiles(**data[name]) for name in _PERCENTILE_FIELDS}}
        for name in ("tpot_s", "ttft_per_1k_prompt_s"):
            if data.get(name) is not None:
                values[name] = Percentiles(**data[name])
        if data.get("pace") is not None:
            values["pace"] = Pace(**data["pace"])
        if data.get("metrics_unreported") is not None:
            values["metrics_unreported"] = tuple(data["metrics_unreported"])
        return cls(**values)


_PERCENTILE_FIELDS = tuple(f.name for f in fields(Measurement) if f.type == "Percentiles")


def _hist_delta(result: ReplayResult, name: str) -> Histogram | None:
    if result.metrics_before is None or result.metrics_after is None:
        return None
    return result.metrics_after.histogram(name).minus(result.metrics_before.histogram(name))


def _counter_delta(result: ReplayResult, name: str) -> float | None:
    if result.metrics_before is None or result.metrics_after is None:
        return None
    return result.metrics_after.value(name) - result.metrics_before.value(name)


def measure(result: ReplayResult, period: int | None = None) -> Measurement:
    """What the replay's requests and vLLM's metrics (before, after and sampled during it) add up to. `period`:
    the requests of one copy of the trace, where the replay repeated it (`Pace.of`)."""
    records: list[RequestRecord] = result.records
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
    ok = [r for r in records if r.outcome is Outcome.OK]
    finished = [r for r in records if r.outcome in (Outcome.OK, Outcome.TRUNCATED)]
    duration = max(result.duration_s, 1e-9)
    queue_s_p50, queue_s_p95, queue_s_mean, queue_source = _queue_figures(result, finished)
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
        queue_s_p50=queue_s_p50,
        queue_s_p95=queue_s_p95,
        queue_s_mean=queue_s_mean,
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
        offered_rps=_offered_rps(records),
        tpot_s=Percentiles.of([r.itl_mean_s for r in finished if r.itl_mean_s is not None]),
        ttft_per_1k_prompt_s=Percentiles.of([t for r in finished if (t := r.ttft_per_1k_prompt_s) is not None]),
        tpot_fastest_s=min((r.decode_s_per_token for r in finished if r.decode_s_per_token is not None),
                           default=None),
        pace=Pace.of(records, period),
        queue_source=queue_source,
        gauge_reads=_reads_in_flight(records, timeline),
        metrics_unreported=None if result.metrics_after is None else result.metrics_after.unreported(READ_METRICS),
    )


def _reads_in_flight(records: list[RequestRecord], timeline: list[TimelineSample]) -> int:
    """The gauge reads taken between the first request's send and the last response."""
    sent = [r.sent_s for r in records if r.sent_s is not None]
    ends = [r.sent_s + r.e2e_s for r in records if r.sent_s is not None and r.e2e_s is not None]
    if not sent or not ends:
        return 0
    first, last = min(sent), max(ends)
    return sum(first <= s.t_s <= last for s in timeline)


QUEUE_PER_REQUEST = "per_request"
QUEUE_HISTOGRAM = "histogram"


def _queue_figures(result: ReplayResult, finished: list[RequestRecord]
                   ) -> tuple[float | None, float | None, float | None, str | None]:
    """p50, p95 and mean queue time, and their source. The requests' own queue times when every finished request
    has one: exact, where a histogram's quantile is interpolated inside a bucket (a p50 of 0.15 s inside the
    first bucket beside a mean of 0.004 s, on an H200). Otherwise vLLM's histogram over the replay."""
    own = [r.queue_s for r in finished if r.queue_s is not None]
    if own and len(own) == len(finished):
        return percentile(own, 50), percentile(own, 95), statistics.fmean(own), QUEUE_PER_REQUEST
    queue = _hist_delta(result, QUEUE_TIME)
    if queue is None or queue.count <= 0:
        return None, None, None, None
    return queue.quantile(0.5), queue.quantile(0.95), queue.mean(), QUEUE_HISTOGRAM


def _offered_rps(records: list[RequestRecord]) -> float | None:
    """The replay's arrival rate as the trace defines it (requests / span); None for a span of 0."""
    span = max((r.scheduled_s for r in records), default=0.0) - min((r.scheduled_s for r in records), default=0.0)
    return len(records) / span if span > 0 else None
