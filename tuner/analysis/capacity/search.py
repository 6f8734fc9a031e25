"""The load of each probe chosen so as to bracket and bisect the highest load that passes (`LoadSearch`, under the
study's `LoadPolicy`), and a trial's judged probes summed up as its capacity (`capacity_of`). The search treats an
inconclusive probe as the bracket's upper edge and says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tuner.analysis.capacity.verdict import DECISIVE_REQUESTS, PERCENTILE_LIMITS, JudgedProbe, Verdict, judge_probe
from tuner.common.errors import TunerError
from tuner.analysis.scoring import Boundary, Capacity
from tuner.traces.records import Trace
from tuner.workers.probes import FixedLoad, LoadPlan, Probe, ProbeRun, probe_trace

LOAD_MODES = ("search", "fixed")


@dataclass(frozen=True)
class LoadPolicy:
    """How a study chooses the load of its trials, as the user set it (`tuner study create --load ...`)."""

    mode: str = "search"  # "search": probes bracket the capacity; "fixed": one replay at the reference load
    precision: float = 0.10  # the search ends once the bracket's upper edge is within this of its lower
    probe_budget: int = 6  # probes per trial at most, the first at the reference load included
    # The loads probed, as multiples of the reference load. Below it the search goes down as far as the machine
    # needs, until requests are served about one at a time (`served_alone`): a machine ten times slower than the
    # one a demo's traffic was chosen on still finds the load it carries.
    min_factor: float = 1 / 256
    max_factor: float = 64.0
    # Each probe's trace is repeated until it holds this many requests: 73 all within a limit are the fewest
    # that tell a p95 from it with 95% confidence.
    probe_requests: int = 80
    # ...and until its arrivals last this long: a burst that arrives within one request's latency ends before a
    # queue could show that it grows, so it tells nothing of the pace the engine keeps (the tight KV budget of
    # tests/integration/test_capacity_vllm.py passed 27 req/s in 32 requests arriving within 1.2 s).
    probe_seconds: float = 20.0
    warmup_requests: int = 8  # replayed before the first probe, kept out of every figure

    def __post_init__(self) -> None:
        if self.mode not in LOAD_MODES:
            raise TunerError(f"load must be one of {', '.join(LOAD_MODES)}, got {self.mode!r}")
        if not 0 < self.precision < 1:
            raise TunerError(f"precision must be between 0 and 1 (0.1 = 10%), got {self.precision:g}")
        if self.probe_budget < 1:
            raise TunerError(f"probe budget must be at least 1, got {self.probe_budget}")
        if not 0 < self.min_factor <= 1 <= self.max_factor < math.inf:
            raise TunerError(f"load bounds must hold the reference load (min <= 1 <= max, both positive), got "
                             f"{self.min_factor:g} to {self.max_factor:g}")
        if self.probe_requests < 1:
            raise TunerError(f"probe requests must be at least 1, got {self.probe_requests}")
        if not 0 <= self.probe_seconds < math.inf:
            raise TunerError(f"probe seconds must be at least 0, got {self.probe_seconds:g}")
        if self.warmup_requests < 0:
            raise TunerError(f"warm-up requests must be at least 0, got {self.warmup_requests}")

    @classmethod
    def from_options(cls, mode: str, precision: float, probe_budget: int, load_range: str | None,
                     probe_requests: int, probe_seconds: float) -> LoadPolicy:
        """The policy as people type it (`--load search --precision 0.1 --load-range 0.25:8 ...`); TunerError
        for a value out of range."""
        min_factor, max_factor = cls.min_factor, cls.max_factor
        if load_range is not None:
            low, sep, high = load_range.partition(":")
            try:
                if not sep:
                    raise ValueError
                min_factor = float(low) if low.strip() else min_factor
                max_factor = float(high) if high.strip() else max_factor
            except ValueError:
                raise TunerError(f"load range must be MIN:MAX multiples of the reference load, got {load_range!r}"
                                 ) from None
        return cls(mode=mode, precision=precision, probe_budget=probe_budget, probe_requests=probe_requests,
                   probe_seconds=probe_seconds, min_factor=min_factor, max_factor=max_factor)

    def refuse_undecidable(self, bound: Boundary, trace_requests: int, trace_span_s: float) -> None:
        """TunerError for a load search whose probes at the reference load could never pass `bound`: a p95 limit
        takes DECISIVE_REQUESTS requests a probe, and a probe there holds the trace's requests or the policy's
        probe requests, whichever is more. Without it every trial would end "no load within the boundary". And
        for a search on a trace whose requests all arrive at once: it has no rate to scale, nor to repeat at."""
        if self.mode == "search" and trace_span_s <= 0:
            raise TunerError(f"a load search scales the trace's rate, and its {trace_requests} requests all arrive "
                             f"at once: give a trace whose requests arrive over time, or --load fixed")
        limited = [name for name in PERCENTILE_LIMITS if getattr(bound, name) is not None]
        held = max(self.probe_requests, trace_requests)
        if self.mode == "search" and limited and held < DECISIVE_REQUESTS:
            raise TunerError(f"a load search against p95 limits ({', '.join(limited)}) needs at least "
                             f"{DECISIVE_REQUESTS} requests a probe, and one at the reference load would hold {held} "
                             f"(the trace's {trace_requests}, --probe-requests {self.probe_requests}), so none could "
                             f"pass: raise --probe-requests, or lift the limits (--limit NAME=none)")

    def for_launch(self, validation: bool) -> LoadPolicy:
        """The policy one launch searches by: a validation launch's has twice the probe budget. Its capacity is what
        the verdict compares, and a bracket the budget leaves wide leaves the verdict undecided: vLLM's default on
        the H100 passed 16.3 req/s and failed 23.1 with its five probes spent (2026-12-06). A launch whose bracket
        settles within the precision stops there, so the extra probes are spent only where they are needed."""
        return replace(self, probe_budget=2 * self.probe_budget) if validation else self

    @classmethod
    def fixed(cls) -> LoadPolicy:
        """One replay at the reference load: the behaviour of studies created before probes came."""
        return cls(mode="fixed")

    def to_dict(self) -> dict[str, Any]:
        """As stored with the study."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LoadPolicy:
        """The policy `to_dict` gave; a study stored without one ran at a fixed load."""
        if not data:
            return cls.fixed()
        data = {"probe_seconds": 0.0, **data}  # a study stored before probes had a least duration had none
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def plan(self, bound: Boundary, *, best_factor: float | None = None, below_reference: bool = False,
             start_factor: float | None = None) -> LoadPlan:
        """The plan a trial runs: a fixed load, or a search that first tries `best_factor` (the best capacity so
        far, against the reference load) or `start_factor` (where its capacity is expected) and, with
        `below_reference`, goes on below a failing reference load."""
        if self.mode == "fixed":
            return FixedLoad()
        return LoadSearch(self, bound, best_factor, below_reference, start_factor)


@dataclass(frozen=True)
class ProbeLength:
    """How long a study's trials replay, known before any runs: its probe at the reference load, the least any other
    probe's arrivals last (one copy of the trace at its rate, and at least the plan's probe duration: a probe at a
    higher load repeats the trace to last as long, one at a lower load lasts longer), and how many probes a trial runs
    at most. A trial that spends its budget replays for at least `trial_arrival_s`, startup and drains aside."""

    requests: int  # in the probe at the reference load
    offered_rps: float
    arrival_s: float  # how long its arrivals last; a probe ends within the request timeout of its last arrival
    least_arrival_s: float  # how long any other probe's arrivals last at least
    probes: int  # a trial's probes at most: 1 at a fixed load; a validation launch's, twice as many in a search

    @classmethod
    def of(cls, trace: Trace, policy: LoadPolicy, bound: Boundary) -> ProbeLength:
        """The probes of a study replaying `trace` (as selected) under `policy` and `bound`."""
        plan = policy.plan(bound)
        probed = probe_trace(trace, 1.0, plan.min_requests, plan.min_span_s)
        probes = policy.probe_budget if policy.mode == "search" else 1
        return cls(len(probed.requests), probed.rate_rps, probed.span_s, max(trace.span_s, plan.min_span_s), probes)

    @property
    def trial_arrival_s(self) -> float:
        """The least a trial that runs all its probes replays for: the reference probe, then the others."""
        return self.arrival_s + (self.probes - 1) * self.least_arrival_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, `trial_arrival_s` included."""
        return {**asdict(self), "trial_arrival_s": self.trial_arrival_s}


@dataclass(frozen=True)
class LoadSearch:
    """Brackets and bisects the highest passing load of a trial, from the probes so far. The first probe is at
    the reference load; then, if a best capacity so far is known, at that load (failing there, the trial cannot
    beat it and the search ends); or, given where the capacity is expected (`start_factor`), at that load and
    then one precision step above it if it passed, below it if it failed, which settles the bracket when the
    expectation holds; then up by doubling until a probe does not pass, and geometric bisection until the bracket
    is within the precision or the probe budget is spent."""

    policy: LoadPolicy
    boundary: Boundary
    best_factor: float | None = None
    below_reference: bool = False
    # A validation launch's start: the capacity its configuration showed in the search, against the reference load.
    start_factor: float | None = None

    @property
    def warmup_requests(self) -> int:
        """The policy's warm-up: requests replayed before the first probe and kept out of every figure."""
        return self.policy.warmup_requests

    @property
    def min_requests(self) -> int:
        """The policy's requests per probe: each probe's trace is repeated until it holds at least this many."""
        return self.policy.probe_requests

    @property
    def min_span_s(self) -> float:
        """The policy's probe duration: each probe's trace is repeated until its arrivals last this long."""
        return self.policy.probe_seconds

    def next_factor(self, runs: Sequence[ProbeRun]) -> float | None:
        """The next load, or None once the probes so far settle the capacity."""
        if not runs:
            return 1.0
        if len(runs) >= self.policy.probe_budget:
            return None
        verdicts = [judge_probe(run.probe, run.records, self.boundary).verdict for run in runs]
        results = [(run.probe.factor, verdict is Verdict.PASS) for run, verdict in zip(runs, verdicts)]
        # A reference load within noise of the boundary is no failure at your traffic: the search goes on below
        # it, so that the trial states a load it surely carries.
        return self._next(results, _carried(runs), below=verdicts[0] is Verdict.INCONCLUSIVE,
                          alone=served_alone(min(runs, key=lambda run: run.probe.factor).probe))

    def _next(self, results: list[tuple[float, bool]], carried: float | None, below: bool = False,
              alone: bool = False) -> float | None:
        policy = self.policy
        lo, hi = bracket(results)
        if lo is None and not (self.below_reference or below):
            return None  # fails at the reference load: infeasible, whatever lies below
        best = self.best_factor
        if best is not None and lo is not None:
            tried = [passed for factor, passed in results if math.isclose(factor, best)]
            if tried and not tried[0]:
                return None  # it cannot beat the best so far
            if not tried and best > lo * (1 + policy.precision):
                return best
        start = self._from_start(results, lo, hi)
        if start is not None:
            return start
        if hi is None:
            assert lo is not None
            return None if lo >= policy.max_factor else min(lo * 2, policy.max_factor)
        if lo is None:
            if hi <= policy.min_factor or alone:
                return None  # the floor, or a load so low that a lower one would serve its requests just as alone
            # Down by half, or straight to what the failing probe carried when that is lower: an overloaded
            # engine completes about what it can sustain.
            step = min(hi / 2, carried) if carried else hi / 2
            return max(step, hi / 16, policy.min_factor)
        if _within(lo, hi, policy.precision):
            return None
        return math.sqrt(lo * hi)

    def _from_start(self, results: list[tuple[float, bool]], lo: float | None, hi: float | None) -> float | None:
        """The start, if it lies inside the bracket so far; once probed, its neighbour one precision step away on
        the side its verdict points to, if that lies inside the bracket; else None (the search goes on as usual)."""
        start = self.start_factor
        if start is None:
            return None
        policy = self.policy
        step = 1 + policy.precision
        verdict = next((passed for factor, passed in results if math.isclose(factor, start)), None)
        if verdict is None:
            candidate = start
        else:
            candidate = start * step if verdict else start / step
            if any(math.isclose(factor, candidate) for factor, _ in results):
                return None
        inside = (lo is None or candidate > lo) and (hi is None or candidate < hi)
        return candidate if inside and policy.min_factor <= candidate <= policy.max_factor else None


# The probes a launch that starts at its expected capacity (`LoadSearch.start_factor`) takes when the expectation
# holds: the reference load, that capacity, and one precision step beyond it, which fails and settles the bracket.
SETTLED_FROM_START = 3


def _within(lo: float, hi: float, precision: float) -> bool:
    """Whether a bracket is within the precision; a hair of tolerance, as a step down by the precision and back up
    need not land on the same float."""
    return hi <= lo * (1 + precision) * (1 + 1e-9)


# Requests in flight at once, on average, below which a probe served its requests about one at a time: by Little's
# law, its arrival rate times their median end-to-end latency.
ALONE_CONCURRENCY = 0.5


def served_alone(probe: Probe) -> bool:
    """Whether the probe's requests were served about one at a time (fewer than ALONE_CONCURRENCY in flight on
    average): a probe that fails so fails at any load, the boundary being beyond the engine itself."""
    m = probe.measurement
    if m is None or not m.offered_rps or m.e2e_s.p50 is None:
        return False
    return m.offered_rps * m.e2e_s.p50 < ALONE_CONCURRENCY


def _carried(runs: Sequence[ProbeRun]) -> float | None:
    """The load the lowest probe so far completed, against the reference (completed over offered req/s, times
    its factor); None when it did not measure."""
    lowest = min(runs, key=lambda run: run.probe.factor).probe
    m = lowest.measurement
    if m is None or not m.offered_rps or not m.completed_rps:
        return None
    return lowest.factor * m.completed_rps / m.offered_rps


def bracket(results: Sequence[tuple[float, bool]]) -> tuple[float | None, float | None]:
    """The highest load that passed, and the lowest above it that did not (None where there is none)."""
    lo = max((f for f, passed in results if passed), default=None)
    hi = min((f for f, passed in results if not passed and (lo is None or f > lo)), default=None)
    return lo, hi



def capacity_of(judged: Sequence[JudgedProbe], policy: LoadPolicy, reference_scale: float,
                best_factor: float | None = None, best_rps: float | None = None) -> Capacity:
    """Sum a trial's judged probes up as its capacity. `reference_scale` is the reference load's rate against the
    trace as recorded; `best_factor`/`best_rps` the best capacity so far, if the search tried it."""
    results = [(j.probe.factor, j.verdict is Verdict.PASS) for j in judged]
    lo, hi = bracket(results)
    rps = {j.probe.factor: j.probe.offered_rps for j in judged}
    edge = next((j for j in judged if j.probe.factor == hi), None)
    if any(j.probe.engine_lost for j in judged):
        ended = "the engine died during a probe"
    elif lo is None:
        lowest = min(judged, key=lambda j: j.probe.factor).probe if judged else None
        ended = "no probe passed" + (f": the reference load {edge.verdict.value}ed" if edge and edge.probe.index == 0
                                     else "")
        if lowest is not None and served_alone(lowest):
            ended += (f", not even at {lowest.offered_rps or 0:.3g} req/s, where requests were served about one at a "
                      f"time: the boundary is beyond this engine at any load")
    elif best_factor is not None and hi is not None and math.isclose(hi, best_factor):
        ended = f"below the best so far (< {best_rps:.3g} req/s)" if best_rps else "below the best so far"
    elif hi is not None and _within(lo, hi, policy.precision):
        ended = f"bracketed within {policy.precision:.0%}"
    elif hi is None and lo >= policy.max_factor:
        ended = f"passed at the highest load allowed (x{policy.max_factor:g} the reference)"
    elif len(judged) >= policy.probe_budget:
        ended = f"probe budget of {policy.probe_budget} spent"
    else:
        ended = "fails at the reference load"
    if edge is not None and edge.verdict is Verdict.INCONCLUSIVE:
        ended += f"; the load above it, {edge.probe.offered_rps or 0:.3g} req/s, was inconclusive"
    return Capacity(rps=rps.get(lo) if lo is not None else None, factor=lo,
                    rate_scale=lo * reference_scale if lo is not None else None,
                    edge_rps=rps.get(hi) if hi is not None else None, probes=len(judged), ended=ended)
