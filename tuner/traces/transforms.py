"""Pure transformations of a trace; each returns a new Trace with the step recorded."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tuner.common.errors import TunerError
from tuner.traces.records import PREFIX_BLOCK_TOKENS, Trace, TraceRequest, Transformation

FIT_MODES = ("clip", "scale")


def _apply(trace: Trace, requests: Sequence[TraceRequest], kind: str, params: dict[str, Any], affected: int) -> Trace:
    step = Transformation(kind, params, affected)
    if not requests:
        raise TunerError(f"{step.label} leaves no requests")
    return trace.with_step(tuple(requests), step)


def window(trace: Trace, start_s: float, end_s: float) -> Trace:
    """Requests with start_s <= arrival < end_s, rebased so that the first kept one arrives at 0."""
    kept = [r for r in trace.requests if start_s <= r.arrival_s < end_s]
    origin = kept[0].arrival_s if kept else 0.0
    rebased = [replace(r, arrival_s=r.arrival_s - origin) for r in kept]
    params = {"start_s": start_s, "end_s": end_s}
    return _apply(trace, rebased, "window", params, len(trace.requests) - len(kept))


def spread_buckets(trace: Trace) -> Trace:
    """Requests that share one recorded arrival spread evenly over the interval to the next arrival: k requests
    at t, the next at t', arrive at t + i(t' - t)/k. Mooncake records arrivals in buckets of about 3 s, and a
    bucket replayed as recorded sends its long prompts all in one instant. The last bucket takes the median
    interval between buckets."""
    times = sorted({r.arrival_s for r in trace.requests})
    intervals = [b - a for a, b in zip(times, times[1:])]
    last_interval = statistics.median(intervals) if intervals else 0.0
    interval = dict(zip(times, intervals + [last_interval]))
    sizes = Counter(r.arrival_s for r in trace.requests)
    seen: Counter[float] = Counter()
    spread = []
    for request in trace.requests:
        t = request.arrival_s
        spread.append(replace(request, arrival_s=t + seen[t] * interval[t] / sizes[t]))
        seen[t] += 1
    changed = sum(a.arrival_s != b.arrival_s for a, b in zip(trace.requests, spread))
    return _apply(trace, spread, "spread", {"last_interval_s": last_interval}, changed)


def scale_rate(trace: Trace, factor: float) -> Trace:
    """Arrivals divided by `factor`: 2 replays the trace at twice its rate."""
    if not 0 < factor < math.inf:
        raise TunerError(f"rate scale factor must be a positive number, got {factor}")
    scaled = [replace(r, arrival_s=r.arrival_s / factor) for r in trace.requests]
    if not all(math.isfinite(r.arrival_s) for r in scaled):
        raise TunerError(f"rate scale factor {factor} is too small: arrival times overflow")
    changed = sum(a.arrival_s != b.arrival_s for a, b in zip(trace.requests, scaled))
    return _apply(trace, scaled, "rate_scale", {"factor": factor}, changed)


def repeat(trace: Trace, min_requests: int, min_span_s: float) -> Trace:
    """The trace followed by copies of itself until it holds at least `min_requests` requests and spans at least
    `min_span_s`: each copy starts one mean gap after the previous one ends, so the rate stays the trace's. A
    copy's prefix blocks get ids of their own: a copy shares prefixes within itself as the original does, and
    never with another copy (the cache would otherwise credit the repetition, not the traffic)."""
    requests = trace.requests
    if len(requests) < 2 or trace.span_s <= 0:
        raise TunerError("a trace of fewer than two requests, or of a zero span, cannot be repeated at its rate")
    period = trace.span_s * len(requests) / (len(requests) - 1)  # the span plus one mean gap
    by_span = math.ceil((min_span_s - trace.span_s) / period) + 1 if min_span_s > trace.span_s else 1
    copies = max(-(-min_requests // len(requests)), by_span)
    if copies == 1:
        return trace
    block_ids = [b for r in requests for b in r.prefix_blocks]
    stride = max(block_ids) + 1 if block_ids else 0
    repeated = [replace(r, arrival_s=r.arrival_s + k * period,
                        prefix_blocks=tuple(b + k * stride for b in r.prefix_blocks))
                for k in range(copies) for r in requests]
    return _apply(trace, repeated, "repeat", {"copies": copies}, len(repeated) - len(requests))


def cap_requests(trace: Trace, n: int) -> Trace:
    """The first n requests."""
    kept = trace.requests[: max(n, 0)]
    return _apply(trace, kept, "max_requests", {"n": n}, len(trace.requests) - len(kept))


def _resized(request: TraceRequest, input_tokens: int, output_tokens: int) -> TraceRequest:
    """The request with new lengths, keeping the prefix blocks that still lie (even partly) in the input."""
    blocks = request.prefix_blocks[: -(-input_tokens // PREFIX_BLOCK_TOKENS)]
    return replace(request, input_tokens=input_tokens, output_tokens=output_tokens, prefix_blocks=blocks)


def _clipped(request: TraceRequest, max_model_len: int) -> TraceRequest:
    """Fit by shortening the input, keeping the output; if the output alone is too long, 1 input token."""
    if request.input_tokens + request.output_tokens <= max_model_len:
        return request
    if request.output_tokens >= max_model_len:
        return _resized(request, 1, max_model_len - 1)
    return _resized(request, max_model_len - request.output_tokens, request.output_tokens)


def _scaled(request: TraceRequest, max_model_len: int, longest: int) -> TraceRequest:
    # Integer floor of length * max_model_len / longest: input and output each round down to at most
    # their exact share, and a length raised from 0 to 1 was below 1 in that share, so the sum still fits
    # and no request needs clipping afterwards.
    input_tokens = max(1, request.input_tokens * max_model_len // longest)
    output_tokens = max(1, request.output_tokens * max_model_len // longest)
    return _resized(request, input_tokens, output_tokens)


def fit_to_context(trace: Trace, max_model_len: int, mode: str) -> Trace:
    """Make every request fit input + output <= max_model_len, by clipping the long ones or scaling all."""
    if max_model_len < 2:
        raise TunerError(f"max_model_len must be at least 2 (1 input and 1 output token), got {max_model_len}")
    if mode not in FIT_MODES:
        raise TunerError(f"unknown fit mode {mode!r}; one of: {', '.join(FIT_MODES)}")
    params: dict[str, Any] = {"max_model_len": max_model_len, "mode": mode}
    if mode == "clip":
        fitted = [_clipped(r, max_model_len) for r in trace.requests]
    else:
        longest = max((r.input_tokens + r.output_tokens for r in trace.requests), default=0)
        if longest > max_model_len:
            params["factor"] = max_model_len / longest
            fitted = [_scaled(r, max_model_len, longest) for r in trace.requests]
        else:
            params["factor"] = 1.0
            fitted = list(trace.requests)
    params["input_tokens_removed"] = sum(a.input_tokens - b.input_tokens for a, b in zip(trace.requests, fitted))
    params["output_tokens_removed"] = sum(a.output_tokens - b.output_tokens for a, b in zip(trace.requests, fitted))
    changed = sum(a != b for a, b in zip(trace.requests, fitted))
    return _apply(trace, fitted, f"fit_{mode}", params, changed)
