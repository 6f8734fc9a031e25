"""Summary statistics of a trace: what a study reports about the load it replayed."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tuner.errors import TunerError
from tuner.traces.records import Trace


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


def _repeat_share(trace: Trace) -> float:
    seen: set[int] = set()
    total = repeats = 0
    for request in trace.requests:
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
        prefix_block_share=_repeat_share(trace),
    )
