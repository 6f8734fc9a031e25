"""One dimension at a time: the same trace replayed at each value of one engine setting or trace dimension.

`tuner compare --vary max_num_seqs=64,256` runs one real trial per value, one after another, everything else
held equal, and says in plain words what the change did: preemptions, requests completed, p95 end-to-end
latency, time spent in vLLM's queue. Trace dimensions are varied the same way (`rate_scale`, `output_scale`,
`input_scale`): each multiplies the trace as selected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.scoring import Boundary, Score, score
from tuner.traces.records import PREFIX_BLOCK_TOKENS, Trace, Transformation
from tuner.traces.selection import TraceSelection, fit_trace, load_trace
from tuner.traces.transforms import scale_rate
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement

# Dimensions of the trace, each a positive factor applied to the trace as selected (1 = as selected).
TRACE_DIMENSIONS = {
    "rate_scale": "arrival rate (2 = requests arrive twice as fast)",
    "output_scale": "every request's output tokens",
    "input_scale": "every request's input tokens",
}
ENGINE_SETTINGS = tuple(f.name for f in fields(EngineConfig))

# Below these, a change is reported as "about the same".
P95_SAME_PCT = 3.0
QUEUE_REL = 0.2  # a queue-time change must be at least this share of the larger value...
QUEUE_ABS_S = 0.01  # ...and at least this many seconds
PREEMPTION_REL = 0.2


# --- the varied dimension ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Variation:
    """One dimension and the values it takes, in the order given."""

    name: str
    kind: str  # "engine" or "trace"
    values: tuple[Any, ...]  # typed: int/float/bool/str for a setting, float factors for the trace
    labels: tuple[str, ...]  # as the user wrote them

    def label(self, i: int) -> str:
        return f"{self.name}={self.labels[i]}"


def parse_vary(text: str, base: EngineConfig | None = None) -> Variation:
    """`NAME=V1,V2[,...]`: an engine setting or a trace dimension, at least two distinct values."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not name:
        raise TunerError(f"--vary expects NAME=V1,V2,..., got {text!r}")
    labels = tuple(v.strip() for v in raw.split(","))
    if any(not v for v in labels):
        raise TunerError(f"--vary {name}: empty value in {raw!r}")
    if len(labels) < 2:
        raise TunerError(f"--vary {name} needs at least two values to compare, got {raw!r}")
    if name in TRACE_DIMENSIONS:
        values: list[Any] = []
        for v in labels:
            try:
                factor = float(v)
            except ValueError:
                raise TunerError(f"{name} expects a positive number, got {v!r}") from None
            if not 0 < factor < math.inf:
                raise TunerError(f"{name} expects a positive number, got {v!r}")
            values.append(factor)
        kind = "trace"
    elif name in ENGINE_SETTINGS:
        if base is not None and name in base.to_dict():
            raise TunerError(f"{name} is both set (--set) and varied (--vary): give it in one place")
        # Typed and checked exactly as `--set` is: unknown names and bad values are the same errors.
        values = [getattr(EngineConfig.from_dict({name: v}), name) for v in labels]
        kind = "engine"
    else:
        raise TunerError(f"cannot vary {name!r}: give an engine setting ({', '.join(ENGINE_SETTINGS)}) "
                         f"or a trace dimension ({', '.join(TRACE_DIMENSIONS)})")
    if len(set(values)) != len(values):
        raise TunerError(f"--vary {name}: the values must differ, got {raw!r}")
    return Variation(name, kind, tuple(values), labels)


# --- reshaping the trace -----------------------------------------------------------------------------


def scale_lengths(trace: Trace, *, input_factor: float = 1.0, output_factor: float = 1.0) -> Trace:
    """Every request's input and output tokens multiplied (rounded, at least 1), the step recorded.

    Prefix blocks that no longer lie (even partly) inside a shortened input are dropped."""
    for label, factor in (("input", input_factor), ("output", output_factor)):
        if not 0 < factor < math.inf:
            raise TunerError(f"{label} scale factor must be a positive number, got {factor}")
    resized = []
    for r in trace.requests:
        input_tokens = max(1, round(r.input_tokens * input_factor))
        output_tokens = max(1, round(r.output_tokens * output_factor))
        blocks = r.prefix_blocks[: -(-input_tokens // PREFIX_BLOCK_TOKENS)]
        resized.append(replace(r, input_tokens=input_tokens, output_tokens=output_tokens, prefix_blocks=blocks))
    changed = sum(a != b for a, b in zip(trace.requests, resized))
    params: dict[str, Any] = {}
    if input_factor != 1.0:
        params["input_factor"] = input_factor
    if output_factor != 1.0:
        params["output_factor"] = output_factor
    return trace.with_step(tuple(resized), Transformation("scale_lengths", params, changed))


def reshape_trace(trace: Trace, dimension: str, factor: float) -> Trace:
    """The trace with one trace dimension multiplied by `factor`; a factor of 1 leaves it as it is."""
    if dimension not in TRACE_DIMENSIONS:
        raise TunerError(f"unknown trace dimension {dimension!r}; one of: {', '.join(TRACE_DIMENSIONS)}")
    if factor == 1.0:
        return trace
    if dimension == "rate_scale":
        return scale_rate(trace, factor)
    if dimension == "output_scale":
        return scale_lengths(trace, output_factor=factor)
    return scale_lengths(trace, input_factor=factor)


# --- one run per value -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareRun:
    """One value's trial, as far as the comparison needs it."""

    label: str  # "max_num_seqs=16"
    value: Any
    measurement: Measurement | None
    failure: str | None = None  # "kv_insufficient: ...", or why nothing was measured
    failure_class: str | None = None
    score: Score | None = None
    record: Any = None  # the trial's TrialRecord, when it was run
    out_dir: Path | None = None

    @property
    def served(self) -> bool:
        return self.failure_class is None and self.measurement is not None and self.measurement.e2e_s.p95 is not None


@dataclass
class CompareResult:
    variation: Variation
    base_config: EngineConfig
    runs: list[CompareRun] = field(default_factory=list)
    boundary: Boundary | None = None

    @property
    def verdicts(self) -> list[str]:
        return verdicts(self.variation.name, self.runs)


def _dir_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]", "_", label)


def run_compare(*, model: Path, trace_path: Path, selection: TraceSelection, variation: Variation,
                base_config: EngineConfig, out_dir: Path, boundary: Boundary | None = None,
                format: str | None = None, startup_timeout_s: float = 600.0, request_timeout_s: float = 600.0,
                extra_args: tuple[str, ...] = (), seed: int = 0,
                on_start: Callable[[int, str, int], None] | None = None,
                on_phase: Callable[[str], None] | None = None,
                on_request_done: Callable[[Any], None] | None = None,
                on_run: Callable[[CompareRun], None] | None = None) -> CompareResult:
    """One real trial per value, one after another; each engine is stopped before the next starts."""
    from tuner.models import inspect_model
    from tuner.workers.trial import TrialSpec, run_trial

    info = inspect_model(model)
    selected = load_trace(trace_path, selection, None, format)  # fitted per value, as a study fits per trial
    result = CompareResult(variation, base_config, boundary=boundary)
    # Every trace is built before the first launch: a bad value fails now, not after minutes of trials.
    plans = []
    for value in variation.values:
        if variation.kind == "engine":
            config, trace = base_config.merged(**{variation.name: value}), selected
        else:
            config, trace = base_config, reshape_trace(selected, variation.name, value)
        trace = fit_trace(trace, selection, config.max_model_len or info.max_position_embeddings)
        plans.append((config, trace))
    for i, (config, trace) in enumerate(plans):
        label = variation.label(i)
        if on_start is not None:
            on_start(i, label, len(trace.requests))
        run_dir = out_dir / _dir_name(label)
        outcome = run_trial(TrialSpec(model=model, trace=trace, config=config, out_dir=run_dir,
                                      startup_timeout_s=startup_timeout_s, request_timeout_s=request_timeout_s,
                                      extra_args=extra_args, seed=seed),
                            on_phase=on_phase, on_request_done=on_request_done)
        record = outcome.record
        m = record.measurement
        failure = failure_class = None
        if record.failure is not None:
            failure_class = record.failure.kind.value
            failure = f"{failure_class}: {record.failure.message}"
        elif m is None or m.e2e_s.p95 is None:
            failure_class, failure = "no_request_finished", "no_request_finished: no request finished"
        scored = score(m, boundary, trace.span_s) if boundary is not None and failure is None else None
        run = CompareRun(label, variation.values[i], m, failure, failure_class, scored, record, run_dir)
        result.runs.append(run)
        if on_run is not None:
            on_run(run)
    return result


# --- the verdict -------------------------------------------------------------------------------------


def _pct(a: float, b: float) -> float:
    return (b - a) / a * 100.0 if a else (0.0 if b == a else math.inf)


def _s(value: float) -> str:
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.0f} ms"


def _join(clauses: list[tuple[str, bool]]) -> str:
    """Clauses (text, for the better) joined with "and" when they point the same way, "but" when not."""
    text = clauses[0][0]
    for (_, prev_good), (clause, good) in zip(clauses, clauses[1:], strict=False):
        text += (" and " if good == prev_good else " but ") + clause
    return text


def pair_verdict(name: str, a: CompareRun, b: CompareRun) -> str:
    """What going from `a` to `b` did, in one plain sentence."""
    head = f"{b.label} rather than {a.label.partition('=')[2] if a.label.startswith(name + '=') else a.label}"
    if not a.served and not b.served:
        return f"{head}: neither served ({a.label}: {a.failure}; {b.label}: {b.failure})"
    if not b.served:
        return f"{head}: the engine did not serve ({b.failure}), where {a.label} did"
    if not a.served:
        return f"{head}: served {b.measurement.completed}/{b.measurement.requests} requests where {a.label} " \
               f"did not ({a.failure})"
    ma, mb = a.measurement, b.measurement
    clauses: list[tuple[str, bool]] = []
    pa, pb = ma.preemptions, mb.preemptions
    if pa > 0 and pb == 0:
        clauses.append((f"removed preemptions ({pa} → 0)", True))
    elif pa == 0 and pb > 0:
        clauses.append((f"brought preemptions (0 → {pb})", False))
    elif pa > 0 and pb > 0 and abs(pb - pa) >= PREEMPTION_REL * max(pa, pb):
        clauses.append((f"{'cut' if pb < pa else 'raised'} preemptions ({pa} → {pb})", pb < pa))
    qa, qb = ma.queue_s_mean, mb.queue_s_mean
    if qa is not None and qb is not None and abs(qb - qa) >= max(QUEUE_ABS_S, QUEUE_REL * max(qa, qb)):
        if qb > qa:
            clauses.append((f"moved the delay into the queue (mean queue time {_s(qa)} → {_s(qb)})", False))
        else:
            clauses.append((f"cut the time spent queued (mean {_s(qa)} → {_s(qb)})", True))
    if mb.completed != ma.completed:
        clauses.append((f"completed {'more' if mb.completed > ma.completed else 'fewer'} requests "
                        f"({ma.completed}/{ma.requests} → {mb.completed}/{mb.requests})", mb.completed > ma.completed))
    text = f"{head}: " + (_join(clauses) if clauses else "changed neither preemptions, queueing nor completions")
    ea, eb = ma.e2e_s.p95, mb.e2e_s.p95
    pct = _pct(ea, eb)
    change = f"{pct:+.0f}%" if math.isfinite(pct) else "from 0"
    if abs(pct) < P95_SAME_PCT:
        text += f": p95 end-to-end about the same ({change}, {_s(ea)} → {_s(eb)})"
    else:
        text += f": p95 end-to-end {change} ({_s(ea)} → {_s(eb)})"
    tail = []
    if pa == 0 and pb == 0:
        tail.append("no preemptions with either")
    if mb.completed == ma.completed and mb.requests == ma.requests:
        tail.append(f"both completed {ma.completed}/{ma.requests}")
    return text + ("; " + ", ".join(tail) if tail else "")


def verdicts(name: str, runs: list[CompareRun]) -> list[str]:
    """Each value against the next, in the order given, and the first against the last when there are more
    than two."""
    pairs = list(zip(runs, runs[1:]))
    if len(runs) > 2:
        pairs.append((runs[0], runs[-1]))
    return [pair_verdict(name, a, b) for a, b in pairs]
