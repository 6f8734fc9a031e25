"""One dimension at a time: the same trace replayed at each value of one engine setting or trace dimension.

`tuner compare --vary max_num_seqs=64,256` runs one real trial per value, one after another, everything else
held equal, and says in plain words what the change did. By default each trial searches its capacity (the
highest load that passes the boundary, tuner.analysis.capacity) and the verdict compares capacities: which value carries
more, or about the same when the two are within the search's precision. At a fixed load (`--load fixed`: one
replay per value) it says what the change did to preemptions, requests completed, p95 end-to-end latency and
time spent in vLLM's queue. Trace dimensions are varied the same way (`rate_scale`, `output_scale`,
`input_scale`): each multiplies the trace as selected. `arrivals=recorded,spread` replays the same requests as
recorded and spread (`--spread`), and the verdict states p95 TTFT too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tuner.analysis.capacity import JudgedProbe, LoadPolicy, capacity_of
from tuner.common.errors import TunerError
from tuner.common.models import inspect_model
from tuner.analysis.scoring import Boundary, Capacity, Score, capacity_line, score
from tuner.traces.records import PREFIX_BLOCK_TOKENS, Trace, Transformation
from tuner.traces.selection import TraceSelection, fit_trace, load_trace
from tuner.traces.transforms import scale_rate
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement
from tuner.workers.probes import FixedLoad, LoadPlan
from tuner.workers.trial import TrialSpec, run_trial

# Dimensions of the trace, each a positive factor applied to the trace as selected (1 = as selected).
TRACE_DIMENSIONS = {
    "rate_scale": "arrival rate (2 = requests arrive twice as fast)",
    "output_scale": "every request's output tokens",
    "input_scale": "every request's input tokens",
}
# When requests arrive: as recorded, or each recorded instant's requests spread up to the next (`--spread`). The
# same requests either way (a window that starts at a recorded instant keeps them), so what changes is only how
# many long prompts reach the engine at once: TTFT shows it first.
ARRIVALS = "arrivals"
ARRIVAL_VALUES = ("recorded", "spread")
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
    kind: str  # "engine", "trace" or "arrivals"
    values: tuple[Any, ...]  # typed: int/float/bool/str for a setting, float factors for the trace, ARRIVAL_VALUES
    labels: tuple[str, ...]  # as the user wrote them

    def label(self, i: int) -> str:
        """The i-th value as the user wrote it, e.g. `max_num_seqs=16`."""
        return f"{self.name}={self.labels[i]}"


def parse_vary(text: str, base: EngineConfig | None = None, spread: bool = False) -> Variation:
    """`NAME=V1,V2[,...]`: an engine setting, a trace dimension or the arrivals (`ARRIVALS`), at least two distinct
    values; `spread`: the selection spreads arrivals already (--spread), so they cannot be varied too."""
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
    elif name == ARRIVALS:
        if spread:
            raise TunerError(f"{ARRIVALS} is both set (--spread) and varied (--vary): give it in one place")
        if unknown := [v for v in labels if v not in ARRIVAL_VALUES]:
            raise TunerError(f"{ARRIVALS} is one of {', '.join(ARRIVAL_VALUES)}, got {unknown[0]!r}")
        values = list(labels)
        kind = ARRIVALS
    elif name in ENGINE_SETTINGS:
        if base is not None and name in base.to_dict():
            raise TunerError(f"{name} is both set (--set) and varied (--vary): give it in one place")
        # Typed and checked exactly as `--set` is: unknown names and bad values are the same errors.
        values = [getattr(EngineConfig.from_dict({name: v}), name) for v in labels]
        kind = "engine"
    else:
        raise TunerError(f"cannot vary {name!r}: give an engine setting ({', '.join(ENGINE_SETTINGS)}), "
                         f"a trace dimension ({', '.join(TRACE_DIMENSIONS)}) or {ARRIVALS}")
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
    probes: tuple[JudgedProbe, ...] = ()  # each probe the trial ran, judged against the boundary
    capacity: Capacity | None = None  # after a load search that probed; None at a fixed load

    @property
    def served(self) -> bool:
        """Whether it ran without a failure class and a p95 end-to-end latency was measured."""
        return self.failure_class is None and self.measurement is not None and self.measurement.e2e_s.p95 is not None


@dataclass
class CompareResult:
    """A comparison: the varied dimension, the configuration the values were applied to, one run per value in order, the
    boundary the runs were judged against (None: not judged) and the load policy they ran under."""

    variation: Variation
    base_config: EngineConfig
    runs: list[CompareRun] = field(default_factory=list)
    boundary: Boundary | None = None
    policy: LoadPolicy = field(default_factory=LoadPolicy.fixed)

    @property
    def verdicts(self) -> list[str]:
        """One sentence per pair of runs (see `verdicts`): by capacity after a load search, else by what the
        single replay measured."""
        return verdicts(self.variation.name, self.runs, self.policy)


def _dir_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]", "_", label)


def run_compare(*, model: Path, trace_path: Path, selection: TraceSelection, variation: Variation,
                base_config: EngineConfig, out_dir: Path, boundary: Boundary | None = None,
                policy: LoadPolicy | None = None, format: str | None = None, startup_timeout_s: float = 600.0,
                request_timeout_s: float = 600.0, extra_args: tuple[str, ...] = (), seed: int = 0,
                on_start: Callable[[int, str, int], None] | None = None,
                on_phase: Callable[[str], None] | None = None,
                on_request_done: Callable[[Any], None] | None = None,
                on_run: Callable[[CompareRun], None] | None = None) -> CompareResult:
    """One real trial per value, one after another; each engine is stopped before the next starts. With a
    load-search `policy` (and a boundary) each trial searches its capacity, going on below a failing reference
    load, and each run carries its judged probes and capacity; without one, each value is replayed once."""
    policy = policy or LoadPolicy.fixed()
    if policy.mode == "search" and boundary is None:
        raise ValueError("a load search needs a boundary to judge its probes against")
    load: LoadPlan = FixedLoad() if boundary is None else policy.plan(boundary, below_reference=True)
    info = inspect_model(model)
    selected = load_trace(trace_path, selection, None, format)  # fitted per value, as a study fits per trial
    if boundary is not None:
        policy.refuse_undecidable(boundary, len(selected.requests), selected.span_s)
    result = CompareResult(variation, base_config, boundary=boundary, policy=policy)
    # Every trace is built before the first launch: a bad value fails now, not after minutes of trials.
    plans = []
    for value in variation.values:
        if variation.kind == "engine":
            config, trace = base_config.merged(**{variation.name: value}), selected
        elif variation.kind == ARRIVALS:  # spread on the recorded clock, before the window, as --spread does
            config = base_config  # (parse_vary refused --spread beside it: the selection as given is "recorded")
            trace = selected if value == "recorded" else load_trace(trace_path, replace(selection, spread=True),
                                                                    None, format)
        else:
            config, trace = base_config, reshape_trace(selected, variation.name, value)
        trace = fit_trace(trace, selection, config.max_model_len or info.max_position_embeddings)
        plans.append((config, trace))
    if variation.kind == ARRIVALS and len({tuple((r.input_tokens, r.output_tokens) for r in t.requests)
                                           for _, t in plans}) > 1:
        raise TunerError("the window starts inside a recorded instant, so spread and recorded arrivals select "
                         "other requests: start it at a recorded arrival (`tuner trace window` prints one)")
    for i, (config, trace) in enumerate(plans):
        label = variation.label(i)
        if on_start is not None:
            on_start(i, label, len(trace.requests))
        run_dir = out_dir / _dir_name(label)
        outcome = run_trial(TrialSpec(model=model, trace=trace, config=config, out_dir=run_dir,
                                      startup_timeout_s=startup_timeout_s, request_timeout_s=request_timeout_s,
                                      extra_args=extra_args, seed=seed, load=load),
                            on_phase=on_phase, on_request_done=on_request_done)
        record = outcome.record
        m = record.measurement
        failure = failure_class = None
        if record.failure is not None:
            failure_class = record.failure.kind.value
            failure = f"{failure_class}: {record.failure.message}"
        elif m is None or m.e2e_s.p95 is None:
            failure_class, failure = "no_request_finished", "no_request_finished: no request finished"
        judged = tuple(JudgedProbe.of(probe, boundary) for probe in outcome.probes) if boundary is not None else ()
        capacity = None
        if policy.mode == "search" and judged:
            # The reference load is the trace as selected, times the varied rate where the rate is what varies.
            reference_scale = (selection.rate_scale or 1.0) * (variation.values[i] if variation.name == "rate_scale"
                                                               else 1.0)
            capacity = capacity_of(judged, policy, reference_scale)
        scored = score(m, boundary, trace.span_s, capacity, whole_share=trace.whole_share) \
            if boundary is not None and failure is None else None
        run = CompareRun(label, variation.values[i], m, failure, failure_class, scored, record, run_dir, judged,
                         capacity)
        result.runs.append(run)
        if on_run is not None:
            on_run(run)
    return result


# --- the verdict -------------------------------------------------------------------------------------


def _pct(a: float, b: float) -> float:
    return (b - a) / a * 100.0 if a else (0.0 if b == a else math.inf)


def _s(value: float) -> str:
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.0f} ms"


def _p95_change(what: str, a: float, b: float) -> str:
    """`p95 end-to-end +16% (3.00 s → 3.48 s)`, or `... about the same (+1%, 3.00 s → 3.03 s)` within
    P95_SAME_PCT."""
    pct = _pct(a, b)
    change = f"{pct:+.0f}%" if math.isfinite(pct) else "from 0"
    if abs(pct) < P95_SAME_PCT:
        return f"{what} about the same ({change}, {_s(a)} → {_s(b)})"
    return f"{what} {change} ({_s(a)} → {_s(b)})"


def _join(clauses: list[tuple[str, bool]]) -> str:
    """Clauses (text, for the better) joined with "and" when they point the same way, "but" when not."""
    text = clauses[0][0]
    for (_, prev_good), (clause, good) in zip(clauses, clauses[1:], strict=False):
        text += (" and " if good == prev_good else " but ") + clause
    return text


def _head(name: str, a: CompareRun, b: CompareRun) -> str:
    """`max_num_seqs=16 rather than 2`: how every verdict sentence begins."""
    return f"{b.label} rather than {a.label.partition('=')[2] if a.label.startswith(name + '=') else a.label}"


def pair_verdict(name: str, a: CompareRun, b: CompareRun) -> str:
    """What going from `a` to `b` did at one fixed load, in one plain sentence."""
    head = _head(name, a, b)
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
    ta, tb = ma.ttft_s.p95, mb.ttft_s.p95
    if name == ARRIVALS and ta is not None and tb is not None:  # what arrivals change first: see ARRIVALS
        text += f": {_p95_change('p95 TTFT', ta, tb)}"
    text += f": {_p95_change('p95 end-to-end', ma.e2e_s.p95, mb.e2e_s.p95)}"
    tail = []
    if pa == 0 and pb == 0:
        tail.append("no preemptions with either")
    if mb.completed == ma.completed and mb.requests == ma.requests:
        tail.append(f"both completed {ma.completed}/{ma.requests}")
    return text + ("; " + ", ".join(tail) if tail else "")


def _no_capacity(run: CompareRun) -> str:
    """Why a run carries no load within the boundary: how its search ended, or why it did not serve."""
    if run.capacity is not None:
        return run.capacity.ended
    return run.failure or "nothing was probed"


def capacity_verdict(name: str, a: CompareRun, b: CompareRun, precision: float) -> str:
    """What going from `a` to `b` did to the load carried within the boundary, in one plain sentence: `b` carries
    more or less than `a` (both capacities in req/s and against the trace's rate, and the change in percent from
    one launch each, said to be not validated), or about the same capacity when the higher is within `precision`
    (0.1 = 10%) of the lower, as the load search cannot tell them apart; or which of the two carries none, and
    why."""
    head = _head(name, a, b)
    ca = capacity_line(a.capacity) if a.capacity is not None else None
    cb = capacity_line(b.capacity) if b.capacity is not None else None
    if ca is None and cb is None:
        if a.capacity is None and b.capacity is None and not a.served and not b.served:
            return pair_verdict(name, a, b)  # neither served: the same sentence as at a fixed load
        return (f"{head}: neither carries any load probed within the boundary ({a.label}: {_no_capacity(a)}; "
                f"{b.label}: {_no_capacity(b)})")
    if ca is None:
        return f"{head}: carries {cb} within the boundary, where {a.label} carries none ({_no_capacity(a)})"
    if cb is None:
        return f"{head}: carries no load probed within the boundary ({_no_capacity(b)}), where {a.label} carries {ca}"
    assert a.capacity is not None and b.capacity is not None
    ra, rb = a.capacity.rps, b.capacity.rps
    assert ra is not None and rb is not None
    if max(ra, rb) <= min(ra, rb) * (1 + precision):
        return (f"{head}: about the same capacity, {cb} against {ca} (within the load search's {precision:.0%} "
                f"precision)")
    # One launch each: a change, not a validated gain (that takes `tuner study validate`'s repeats and interval).
    return (f"{head}: carries {'more' if rb > ra else 'less'}, {cb} against {ca} ({_pct(ra, rb):+.0f}%, one launch "
            f"each, not validated)")


def verdicts(name: str, runs: list[CompareRun], policy: LoadPolicy | None = None) -> list[str]:
    """Each value against the next, in the order given, and the first against the last when there are more
    than two: by capacity after a load search (`capacity_verdict`), by what the one replay measured at a fixed
    load (`pair_verdict`; also when `policy` is None)."""
    pairs = list(zip(runs, runs[1:]))
    if len(runs) > 2:
        pairs.append((runs[0], runs[-1]))
    if policy is not None and policy.mode == "search":
        return [capacity_verdict(name, a, b, policy.precision) for a, b in pairs]
    return [pair_verdict(name, a, b) for a, b in pairs]
