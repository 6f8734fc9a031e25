"""From a measurement to a score: two objectives, and the limits of a boundary as Optuna constraints.

Objectives: maximize the capacity (the highest load that passes, found by tuner.analysis.capacity's load search; at a
fixed load, the completed requests per second), minimize p95 end-to-end latency at the reference load. A
boundary says what users will put up with; a trial outside it at the reference load is infeasible (constraint
values > 0), so it never enters the Pareto front Optuna reports nor the recommendation. A trial that never
served is not scored at all: it is a failed trial with its failure class.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tuner.common.errors import TunerError
from tuner.workers.measure import Measurement, Pace

OBJECTIVE_NAMES = ("completed_rps", "e2e_p95_s")  # at a fixed load
# With a load search; the first is the capacity carried whole (Score.carried_rps), the capacity itself unless the
# trial's max_model_len clipped requests.
SEARCH_OBJECTIVE_NAMES = ("capacity_rps", "e2e_p95_s")
DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class Boundary:
    """Limits a configuration must meet to be recommended. None = no limit on that figure."""

    name: str
    ttft_p95_s: float | None  # p95 time to first token
    e2e_p95_s: float | None  # p95 submission to final token
    min_completion_ratio: float  # requests served in full / requests sent
    makespan_factor: float | None  # the replay may take at most this many times the trace's span ...
    makespan_grace_s: float  # ... plus this, so that a short slice is not held to an impossible pace
    # p95 over requests of their mean time per output token after the first (TPOT, inter-token latency)
    tpot_p95_s: float | None = None
    # p95 over requests of TTFT per 1,000 prompt tokens, a prompt under 1,000 counted as 1,000: a TTFT limit that
    # grows with the prompt, for traffic whose long prompts cannot meet a flat one
    ttft_per_1k_prompt_p95_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_p95_s", "e2e_p95_s", "makespan_factor", "tpot_p95_s", "ttft_per_1k_prompt_p95_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise TunerError(f"boundary limit {name} must be positive, got {value}")
        if not 0 < self.min_completion_ratio <= 1:
            raise TunerError(f"boundary limit min_completion_ratio must be in (0, 1], got {self.min_completion_ratio}")
        if self.makespan_grace_s < 0:
            raise TunerError(f"boundary limit makespan_grace_s must not be negative, got {self.makespan_grace_s}")

    def with_limits(self, limits: dict[str, float | None]) -> Boundary:
        """This boundary with some limits overridden (as a study stores them)."""
        known = {f.name for f in fields(self)} - {"name"}
        unknown = sorted(set(limits) - known)
        if unknown:
            raise TunerError(f"unknown boundary limit {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return replace(self, **limits)  # type: ignore[arg-type]  # each name was checked against the fields

    def ttft_checks(self, measurement: Measurement) -> list[tuple[str, float | None, float | None]]:
        """(limit name, the measurement's figure, this boundary's limit) for each limit on first tokens: the flat p95,
        and the p95 per 1,000 prompt tokens; None where there is no figure or no limit."""
        per_1k = measurement.ttft_per_1k_prompt_s.p95 if measurement.ttft_per_1k_prompt_s else None
        return [("ttft_p95_s", measurement.ttft_s.p95, self.ttft_p95_s),
                ("ttft_per_1k_prompt_p95_s", per_1k, self.ttft_per_1k_prompt_p95_s)]

    def ttft_over(self, measurement: Measurement) -> bool:
        """Whether the measurement's first tokens came later than a TTFT limit of this boundary allows."""
        return any(value is not None and limit is not None and value > limit
                   for _, value, limit in self.ttft_checks(measurement))

    def makespan_limit_s(self, trace_span_s: float) -> float | None:
        """The longest a replay of a trace spanning `trace_span_s` may take, in seconds; None when the boundary sets no
        makespan limit."""
        if self.makespan_factor is None:
            return None
        return self.makespan_factor * trace_span_s + self.makespan_grace_s

    def to_dict(self) -> dict:
        """JSON-ready, every field including the name: kept as the study's `boundary` user attribute and shown in
        reports."""
        return asdict(self)


# The boundary limits on first tokens (`Boundary.ttft_checks`), as the score's constraints name them.
TTFT_LIMITS = ("ttft_p95_s", "ttft_per_1k_prompt_p95_s")

# The documented defaults; every limit can be overridden per study (`tuner study create --limit NAME=VALUE`).
BOUNDARIES: dict[str, Boundary] = {
    # A person waits on each answer: the first token within 2 s and the whole answer within 30 s for 95% of
    # requests, and at most 1% of requests may fail. No limit on the time per output token unless set
    # (`--limit tpot_p95_s=0.1` holds streaming to 10 tokens a second, faster than people read).
    "interactive": Boundary("interactive", ttft_p95_s=2.0, e2e_p95_s=30.0, min_completion_ratio=0.99,
                            makespan_factor=None, makespan_grace_s=0.0),
    # A person waits on each answer to a long prompt (documents, long conversations): its first token may take 0.5 s
    # per 1,000 prompt tokens (6 s for 12,000; a prompt under 1,000 tokens counts as 1,000), the whole answer 60 s.
    "long-prompt": Boundary("long-prompt", ttft_p95_s=None, e2e_p95_s=60.0, min_completion_ratio=0.99,
                            makespan_factor=None, makespan_grace_s=0.0, ttft_per_1k_prompt_p95_s=0.5),
    # Offline work: every request must be served and the whole trace done within twice its span (plus a
    # minute); latency only has to stay below the 10-minute request timeout.
    "batch": Boundary("batch", ttft_p95_s=None, e2e_p95_s=600.0, min_completion_ratio=1.0,
                      makespan_factor=2.0, makespan_grace_s=60.0),
}


def boundary(name: str, limits: dict[str, float | None] | None = None) -> Boundary:
    """The boundary named `name` (one of BOUNDARIES) with `limits` overriding its defaults; TunerError for an unknown
    name or limit, or a value out of range."""
    if name not in BOUNDARIES:
        raise TunerError(f"unknown boundary {name!r}; one of: {', '.join(BOUNDARIES)}")
    return BOUNDARIES[name].with_limits(limits or {})


def parse_limits(items: list[str]) -> dict[str, float | None]:
    """`NAME=VALUE` strings from the command line; `none` lifts a limit."""
    limits: dict[str, float | None] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise TunerError(f"expected LIMIT=VALUE, got {item!r}")
        try:
            limits[name.strip()] = None if raw.strip().lower() == "none" else float(raw)
        except ValueError:
            raise TunerError(f"limit {name.strip()} expects a number or none, got {raw!r}") from None
    return limits


@dataclass(frozen=True)
class Capacity:
    """The highest offered load a configuration carried within its boundary, and how the search ended."""

    rps: float | None  # the highest passing probe's offered load, req/s; None when no probe passed
    factor: float | None  # that load against the reference load
    rate_scale: float | None  # that load against the trace's recorded rate
    edge_rps: float | None  # the lowest load above it that did not pass (failed or inconclusive)
    probes: int
    ended: str  # why the search ended, for people

    @property
    def bracket(self) -> float:
        """How far above the capacity the lowest load that did not pass lay (edge / capacity - 1): where in it the
        true capacity lies the probes cannot tell. Infinite where no load above it failed (its probes or the load
        range ran out while it still passed); 0 where no probe passed."""
        if not self.rps:
            return 0.0
        return math.inf if self.edge_rps is None else self.edge_rps / self.rps - 1

    def to_dict(self) -> dict[str, Any]:
        """As stored."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Capacity:
        """The capacity `to_dict` gave."""
        return cls(**data)


def capacity_line(capacity: Capacity) -> str | None:
    """The load a capacity stands for, `3.4 req/s (x1.7 the trace's rate)`; None when no probe passed."""
    if capacity.rps is None:
        return None
    scale = f" (x{capacity.rate_scale:.3g} the trace's rate)" if capacity.rate_scale is not None else ""
    return f"{capacity.rps:.3g} req/s{scale}"


@dataclass(frozen=True)
class Score:
    """How a trial that served did: its objectives, and its distance to each limit of the boundary."""

    completed_rps: float
    e2e_p95_s: float
    output_tps: float
    completion_ratio: float
    constraints: dict[str, float]  # each <= 0 when met: the measured figure minus its limit
    violations: list[str]  # the same, for people
    capacity: Capacity | None = None  # found by a load search; None for a trial at a fixed load
    # The share of the trace's requests served as asked (Trace.whole_share): the rest were clipped to the engine's
    # max_model_len, and vLLM refuses such a prompt, so the traffic carried whole is that share of the load.
    whole_share: float = 1.0

    @property
    def feasible(self) -> bool:
        """Whether the trial met every limit of its boundary."""
        return not self.violations

    @property
    def carried_rps(self) -> float:
        """The traffic it carries whole: its capacity (at a fixed load, its completed req/s) times `whole_share`,
        so that a max_model_len which clips half the prompts does not pass for twice the capacity."""
        carried = (self.capacity.rps or 0.0) if self.capacity is not None else self.completed_rps
        return carried * self.whole_share

    @property
    def objectives(self) -> tuple[float, float]:
        """What Optuna is told: the traffic carried whole (`carried_rps`) and the p95 end-to-end latency at the
        reference load."""
        return self.carried_rps, self.e2e_p95_s

    def to_dict(self) -> dict:
        """As stored (the trial's `score` column), with `feasible` added; from_dict reads it back."""
        return {**asdict(self), "feasible": self.feasible}

    @classmethod
    def from_dict(cls, data: dict) -> Score:
        """The score `to_dict` gave (`feasible` is computed again, not read)."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if values.get("capacity") is not None:
            values["capacity"] = Capacity.from_dict(values["capacity"])
        return cls(**values)


@dataclass(frozen=True)
class Rejection:
    """The verdict on a proposal that the search space's rules refused before launch: never measured, so never
    scored, and never feasible."""

    violations: list[str]

    @property
    def feasible(self) -> bool:
        """Always False: a refused proposal never meets the boundary."""
        return False

    def to_dict(self) -> dict:
        """As stored (the trial's `score` column): the violations, with `feasible` False; from_dict reads it back."""
        return {"feasible": self.feasible, "violations": self.violations}

    @classmethod
    def from_dict(cls, data: dict) -> Rejection:
        """The rejection `to_dict` gave."""
        return cls(data["violations"])


# The engine did not keep up when more than this share of the requests due in a replay's last two thirds (and
# more than STEADY_SHORTFALL_MIN of them) had not finished by the window's end plus the early requests' p90
# latency, while the latency grew through the replay (the last third's median end-to-end latency at least
# STEADY_TREND times the first third's) or more than STEADY_SHORTFALL_DECISIVE of them were late: a queue that
# grows does the first; a burst far beyond the engine, which its batch absorbs so that early and late requests
# finish alike late, the second; one pause of a busy machine delays only the requests around it. On the main
# job's probe a 2 s pause failed a steady engine 13-24% of the time by the shortfall alone, 1-4% so, with the same
# power against 10% overload (benchmarks/pace_false_failures.py)...
STEADY_SHORTFALL_SHARE = 0.15
STEADY_SHORTFALL_MIN = 3
STEADY_TREND = 1.5
STEADY_SHORTFALL_DECISIVE = 0.5
# Where the probe repeats its trace, "grew" is read from what the engine served instead: less than STEADY_CARRIED
# of one copy's requests in the median span one copy long (Pace.carried_share), which compares like with like. The
# last third of the bundled Azure cut's first 300 requests asks for twice the output tokens of the first third, so
# the trend read x1.55-1.75 on an H100 that kept up, failing vLLM's default at 16.2 and 17.6 req/s, where it served
# every copy's requests in every span. In benchmarks/pace_false_failures.py --carried, 0.95 fails 90-100% of
# engines 10% overloaded on the main job's probe (0.9: 0-37%) and at most 8% of steady ones paused for 5 s (the
# trend: 23%); one 16-request copy short of one request reads 0.94.
STEADY_CARRIED = 0.95
# ...or when the tail took longer to drain, beyond that latency, than the arrivals took to come.
DRAIN_WINDOW_RATIO = 1.0
# Early requests whose p90 latency is more than this share of the arrival window overlap most of the later ones:
# they are no yardstick of an engine not yet behind (pace_undecided).
EARLY_LAG_SHARE = 0.5


def pace_violations(pace: Pace | None) -> list[str]:
    """Why the engine did not keep up with the replay's arrivals (empty when it did, or when the measurement has
    no pace): a queue a longer run would never drain, whatever the percentiles say."""
    if pace is None or pace.window_s <= 0:
        return []
    return [reason for reason in (late_violation(pace, _grew(pace)), drain_violation(pace)) if reason is not None]


def late_violation(pace: Pace, grew: bool) -> str | None:
    """The first rule of `pace_violations`: many of the window's later requests finished late, while the latency
    `grew` through the replay (`_grew`) or most of them did. None where it holds."""
    most_late = pace.steady_shortfall > STEADY_SHORTFALL_DECISIVE * pace.steady_arrivals
    if not (_many_late(pace) and (grew or most_late)):
        return None
    return (f"did not keep up: of {pace.steady_arrivals} requests due in the last two thirds of the "
            f"{pace.window_s:.1f} s arrival window, {pace.steady_completed} finished within the early "
            f"requests' p90 latency ({pace.lag_s:.2f} s) of it{_growth_said(pace)}")


def drain_violation(pace: Pace) -> str | None:
    """The second rule of `pace_violations`: the tail drained, beyond the early requests' latency, for longer than
    the arrivals took to come. None where it holds."""
    if pace.drain_s is None or pace.drain_s - pace.lag_s <= DRAIN_WINDOW_RATIO * pace.window_s:
        return None
    return (f"did not keep up: the last response came {pace.drain_s:.1f} s after the last arrival, longer than "
            f"the {pace.window_s:.1f} s the arrivals took and the early requests' p90 latency ({pace.lag_s:.2f} s)")


def _grew(pace: Pace) -> bool:
    """Whether a queue grew through the replay: the engine served less than a copy's requests per copy of the trace
    where the probe repeated it, the median latency grew across thirds otherwise."""
    if pace.carried_share is not None:
        return pace.carried_share < STEADY_CARRIED
    return pace.e2e_trend is None or pace.e2e_trend >= STEADY_TREND


def _growth_said(pace: Pace) -> str:
    """The growth `_grew` read, as the tail of a violation; empty when there is no figure to give."""
    if pace.carried_share is not None:
        return (f"; in a span as long as one copy of the trace, it served {pace.carried_share:.0%} of the requests "
                f"one copy brings")
    return f"; the median latency grew x{pace.e2e_trend:.2g}" if pace.e2e_trend is not None else ""


def _many_late(pace: Pace) -> bool:
    """Whether more of the window's later requests finished after the early requests' latency than a steady engine
    lets finish so."""
    return pace.steady_shortfall > max(STEADY_SHORTFALL_MIN, STEADY_SHORTFALL_SHARE * pace.steady_arrivals)


def pace_undecided(pace: Pace | None) -> str | None:
    """Why a replay that broke no pace rule still cannot show that the engine kept up, or None. The early requests'
    latency is the yardstick of both rules, and an engine overloaded from the first seconds queues them too, so
    that it hides the queue it should measure. So a replay cannot show the pace when its arrivals ended before its
    early requests were served (a tight KV budget passed five times what it carries so, on a crowded machine: a
    5.3 s window, early p90 23.4 s), nor when those requests took more than half the window and many later ones
    finished later still: vLLM's default on an H100 passed 25 req/s so, a load at which a longer replay showed it
    falling behind (a 24 s window, early p90 16.8 s, 149 of 423 later requests late, the median latency x1.25)."""
    if pace is None or pace.window_s <= 0:
        return None
    if pace.lag_s > pace.window_s:
        return (f"too short to tell whether the engine kept up: the arrivals lasted {pace.window_s:.1f} s, less than "
                f"the early requests' p90 latency ({pace.lag_s:.2f} s); longer probes (--probe-seconds) tell")
    if pace.lag_s > EARLY_LAG_SHARE * pace.window_s and _many_late(pace):
        return (f"too short to tell whether the engine kept up: the early requests' p90 latency ({pace.lag_s:.2f} s) "
                f"was more than half of the {pace.window_s:.1f} s the arrivals lasted, and {pace.steady_shortfall} of "
                f"the {pace.steady_arrivals} later requests finished after it; longer probes (--probe-seconds) tell")
    return None


def score(measurement: Measurement, bound: Boundary, trace_span_s: float, capacity: Capacity | None = None, *,
          judge_pace: bool = False, whole_share: float = 1.0) -> Score:
    """Score a trial that served (measurement.e2e_s.p95 is set: at least one request finished) by its measurement
    at the reference load and, after a load search, its capacity; `whole_share` of its trace's requests were served
    as asked (Score.whole_share). With `judge_pace`, an engine that did not keep up with the arrivals breaks
    the boundary too (a load search judges it so; a fixed load never did)."""
    if measurement.e2e_s.p95 is None:
        raise ValueError("a trial in which no request finished has no score")
    ratio = measurement.completed / measurement.requests if measurement.requests else 0.0
    flat_ttft, per_prompt_ttft = ((name, value, limit, "s") for name, value, limit in bound.ttft_checks(measurement))
    checks: list[tuple[str, float | None, float | None, str]] = [
        flat_ttft,
        ("e2e_p95_s", measurement.e2e_s.p95, bound.e2e_p95_s, "s"),
        ("tpot_p95_s", measurement.tpot_s.p95 if measurement.tpot_s else None, bound.tpot_p95_s, "s"),
        per_prompt_ttft,
        ("makespan_s", measurement.duration_s, bound.makespan_limit_s(trace_span_s), "s"),
    ]
    constraints: dict[str, float] = {}
    violations: list[str] = []
    for name, value, limit, unit in checks:
        if limit is None or value is None:
            continue
        constraints[name] = value - limit
        if value > limit:
            violations.append(f"{name} {value:.3f} {unit} is over the limit {limit:.3f} {unit}")
    constraints["completion_ratio"] = bound.min_completion_ratio - ratio
    if ratio < bound.min_completion_ratio:
        violations.append(f"completion ratio {ratio:.3f} is under the limit {bound.min_completion_ratio:.3f}")
    if judge_pace:  # a pace the replay could not show is no pace kept: not within the boundary either
        undecided = pace_undecided(measurement.pace)
        behind = pace_violations(measurement.pace) or ([undecided] if undecided else [])
        constraints["kept_up"] = 1.0 if behind else -1.0
        violations.extend(behind)
    return Score(measurement.completed_rps, measurement.e2e_s.p95, measurement.output_tps, ratio,
                 constraints, violations, capacity, whole_share)
