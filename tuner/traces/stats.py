"""Summary statistics of a trace: what a study reports about the load it replayed."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tuner.common.errors import TunerError
from tuner.traces.records import Trace, TraceRequest


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of non-empty `values`, interpolated linearly between the closest ranks
    (numpy's default): the one percentile method of every figure tuner computes, traces and trials alike."""
    return float(np.percentile(values, q, method="linear"))


@dataclass(frozen=True)
class TraceStats:
    """Size, pacing and length distribution of a trace."""

    requests: int
    span_s: float
    rate_rps: float  # requests / span; 0 when the span is 0
    gap_cv: float  # coefficient of variation of inter-arrival gaps: 1 for Poisson, higher for bursty
    input_p50: float
    input_p95: float
    input_p99: float
    output_p50: float
    output_p95: float
    output_p99: float
    prefix_block_share: float  # share of prefix blocks that repeat an earlier block id

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return asdict(self)


def _gap_cv(arrivals: list[float]) -> float:
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    if len(gaps) < 2:
        return 0.0
    mean = statistics.fmean(gaps)
    # statistics.pstdev sums exactly, so huge gaps cannot overflow.
    return statistics.pstdev(gaps) / mean if mean > 0 else 0.0


def _repeat_share(requests: Sequence[TraceRequest]) -> float:
    seen: set[int] = set()
    total = repeats = 0
    for request in requests:
        for block in request.prefix_blocks:
            total += 1
            repeats += block in seen
            seen.add(block)
    return repeats / total if total else 0.0


def trace_stats(trace: Trace) -> TraceStats:
    """Statistics of a trace with at least one request."""
    if not trace.requests:
        raise TunerError(f"{trace.source}: trace has no requests")
    inputs = [r.input_tokens for r in trace.requests]
    outputs = [r.output_tokens for r in trace.requests]
    span = trace.span_s
    return TraceStats(
        requests=len(trace.requests),
        span_s=span,
        rate_rps=trace.rate_rps,
        gap_cv=_gap_cv([r.arrival_s for r in trace.requests]),
        input_p50=percentile(inputs, 50),
        input_p95=percentile(inputs, 95),
        input_p99=percentile(inputs, 99),
        output_p50=percentile(outputs, 50),
        output_p95=percentile(outputs, 95),
        output_p99=percentile(outputs, 99),
        prefix_block_share=_repeat_share(trace.requests),
    )


@dataclass(frozen=True)
class ReuseWindow:
    """A window of consecutive requests whose prefix reuse is typical of the trace: the median among every window
    of as many requests. A trial's prefix cache starts empty, so a window counts only the blocks repeated inside
    it, and its share is lower than the whole trace's."""

    start_s: float  # the first request's arrival on the trace's clock: `--window START: --max-requests N`
    requests: int
    share: float  # repeated prefix blocks within the window
    trace_share: float  # within the whole trace
    windows: int  # windows of this many requests compared (one per distinct first arrival)
    share_p10: float
    share_p90: float

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return asdict(self)


def typical_reuse_window(trace: Trace, requests: int) -> ReuseWindow:
    """The window of `requests` consecutive requests whose repeated-block share is the median over the trace. A
    window starts at a distinct arrival, so that `--window START:` keeps every request of its first instant."""
    all_requests = trace.requests
    if not any(r.prefix_blocks for r in all_requests):
        raise TunerError(f"{trace.source}: the trace records no prefix blocks, so it has no prefix reuse to match")
    if not 1 <= requests <= len(all_requests):
        raise TunerError(f"a window of {requests} requests does not fit a trace of {len(all_requests)}")
    starts = [i for i in range(len(all_requests) - requests + 1)
              if i == 0 or all_requests[i].arrival_s > all_requests[i - 1].arrival_s]
    shares = [_repeat_share(all_requests[i:i + requests]) for i in starts]
    median = percentile(shares, 50)
    # The first window closest to the median; ties go to the earliest, so the pick is reproducible.
    best = min(range(len(starts)), key=lambda k: (abs(shares[k] - median), k))
    return ReuseWindow(start_s=all_requests[starts[best]].arrival_s, requests=requests, share=shares[best],
                       trace_share=_repeat_share(all_requests), windows=len(starts),
                       share_p10=percentile(shares, 10), share_p90=percentile(shares, 90))
