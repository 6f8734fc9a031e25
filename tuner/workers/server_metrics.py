"""vLLM's own view of a replay, from its Prometheus endpoint: counters, histograms, a sampled timeline."""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

PREEMPTIONS = "vllm:num_preemptions_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
QUEUE_TIME = "vllm:request_queue_time_seconds"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
_TIMELINE_PREFIXES = (RUNNING + "{", WAITING + "{", KV_USAGE + "{")
# Every metric a measurement reads: counters as their samples are named, histograms by their own name.
READ_METRICS = (PREEMPTIONS, RUNNING, WAITING, KV_USAGE, QUEUE_TIME, INFERENCE_TIME, PREFIX_QUERIES, PREFIX_HITS)


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound, summed over label sets."""

    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), sorted by le
    total: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations between `earlier` and this read of the same histogram (a bucket `earlier` lacks counts as
        0)."""
        before = dict(earlier.buckets)
        return Histogram(tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
                         self.total - earlier.total, self.count - earlier.count)

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear interpolation inside the bucket that holds the rank."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower_bound  # the rank lies past the last finite bound
                width = cumulative - lower_count
                share = (rank - lower_count) / width if width > 0 else 1.0
                return lower_bound + (le - lower_bound) * share
            lower_bound, lower_count = le, cumulative
        return lower_bound

    def mean(self) -> float | None:
        """The mean observed value; None when nothing was observed."""
        return self.total / self.count if self.count > 0 else None


@dataclass(frozen=True)
class MetricsSnapshot:
    """One read of vLLM's /metrics: each sample and histogram summed over its label sets."""

    samples: dict[str, float]  # sample name -> value summed over label sets
    histograms: dict[str, Histogram]

    def value(self, name: str) -> float:
        """The sample's value summed over label sets; 0 when the server did not report it."""
        return self.samples.get(name, 0.0)

    def unreported(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Those of `names` this read had neither as a sample nor as a histogram."""
        return tuple(n for n in names if n not in self.samples and n not in self.histograms)

    def histogram(self, name: str) -> Histogram:
        """The histogram named `name` (without `_bucket`); an empty one when the server did not report it."""
        return self.histograms.get(name, Histogram((), 0.0, 0.0))


def parse_metrics(text: str) -> MetricsSnapshot:
    """Prometheus text exposition as a snapshot: `_bucket` samples become histograms by name, every other sample is
    summed over its label sets."""
    samples: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") and "le" in sample.labels:
                buckets[sample.name[: -len("_bucket")]][float(sample.labels["le"])] += sample.value
            else:
                samples[sample.name] += sample.value
    histograms = {
        name: Histogram(tuple(sorted(by_le.items())), samples.get(name + "_sum", 0.0),
                        samples.get(name + "_count", 0.0))
        for name, by_le in buckets.items()
    }
    return MetricsSnapshot(dict(samples), histograms)


async def scrape(client: httpx.AsyncClient, base_url: str, only: tuple[str, ...] | None = None) -> MetricsSnapshot:
    """One read of /metrics; `only` keeps the lines of those metrics, so that frequent samples stay cheap
    for the event loop that also sends the replay's requests."""
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    text = response.text
    if only is not None:
        text = "\n".join(line for line in text.splitlines() if line.startswith(only)) + "\n"
    return parse_metrics(text)


@dataclass(frozen=True)
class TimelineSample:
    """vLLM's running and waiting requests and its KV cache usage at one moment of a replay."""

    t_s: float  # since the replay started
    running: float
    waiting: float
    kv_usage: float  # 0..1


# What a read of /metrics raises when the server is dying: no answer, or a page cut short that does not parse.
SCRAPE_ERRORS = (httpx.HTTPError, ValueError)


@dataclass
class MetricsSampler:
    """Samples running, waiting and KV usage every `interval_s` while a replay runs."""

    client: httpx.AsyncClient
    base_url: str
    interval_s: float = 0.25
    samples: list[TimelineSample] = field(default_factory=list)

    async def run(self, started: float) -> None:
        """Sample until cancelled, every `interval_s`, times taken against `started` (perf_counter); a failed read
        leaves a gap and never raises."""
        while True:
            try:
                snap = await scrape(self.client, self.base_url, _TIMELINE_PREFIXES)
                self.samples.append(TimelineSample(time.perf_counter() - started, snap.value(RUNNING),
                                                   snap.value(WAITING), snap.value(KV_USAGE)))
            except SCRAPE_ERRORS:
                pass  # a dying server: a gap in the timeline; the replay records what users saw
            await asyncio.sleep(self.interval_s)
