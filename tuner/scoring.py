"""From a measurement to a score: two objectives, and the limits of a boundary as Optuna constraints.

Objectives: maximize completed requests per second, minimize p95 end-to-end latency. A boundary says what
users will put up with; a trial outside it is infeasible (constraint values > 0), so it never enters the
Pareto front Optuna reports nor the recommendation. A trial that never served is not scored at all: it is a
failed trial with its failure class.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from tuner.errors import TunerError
from tuner.workers.measure import Measurement

OBJECTIVE_NAMES = ("completed_rps", "e2e_p95_s")
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

    def __post_init__(self) -> None:
        for name in ("ttft_p95_s", "e2e_p95_s", "makespan_factor"):
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

    def makespan_limit_s(self, trace_span_s: float) -> float | None:
        if self.makespan_factor is None:
            return None
        return self.makespan_factor * trace_span_s + self.makespan_grace_s

    def to_dict(self) -> dict:
        return asdict(self)


# The documented defaults; every limit can be overridden per study (`tuner study create --limit NAME=VALUE`).
BOUNDARIES: dict[str, Boundary] = {
    # A person waits on each answer: the first token within 2 s and the whole answer within 30 s for 95% of
    # requests, and at most 1% of requests may fail.
    "interactive": Boundary("interactive", ttft_p95_s=2.0, e2e_p95_s=30.0, min_completion_ratio=0.99,
                            makespan_factor=None, makespan_grace_s=0.0),
    # Offline work: every request must be served and the whole trace done within twice its span (plus a
    # minute); latency only has to stay below the 10-minute request timeout.
    "batch": Boundary("batch", ttft_p95_s=None, e2e_p95_s=600.0, min_completion_ratio=1.0,
                      makespan_factor=2.0, makespan_grace_s=60.0),
}


def boundary(name: str, limits: dict[str, float | None] | None = None) -> Boundary:
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
class Score:
    """How a trial that served did: its objectives, and its distance to each limit of the boundary."""

    completed_rps: float
    e2e_p95_s: float
    output_tps: float
    completion_ratio: float
    constraints: dict[str, float]  # each <= 0 when met: the measured figure minus its limit
    violations: list[str]  # the same, for people

    @property
    def feasible(self) -> bool:
        return not self.violations

    @property
    def objectives(self) -> tuple[float, float]:
        return self.completed_rps, self.e2e_p95_s

    def to_dict(self) -> dict:
        return {**asdict(self), "feasible": self.feasible}

    @classmethod
    def from_dict(cls, data: dict) -> Score:
        """The score `to_dict` gave (`feasible` is computed again, not read)."""
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Rejection:
    """The verdict on a proposal that the search space's rules refused before launch: never measured, so never
    scored, and never feasible."""

    violations: list[str]

    @property
    def feasible(self) -> bool:
        return False

    def to_dict(self) -> dict:
        return {"feasible": self.feasible, "violations": self.violations}

    @classmethod
    def from_dict(cls, data: dict) -> Rejection:
        """The rejection `to_dict` gave."""
        return cls(data["violations"])


def score(measurement: Measurement, bound: Boundary, trace_span_s: float) -> Score:
    """Score a trial that served (measurement.e2e_s.p95 is set: at least one request finished)."""
    if measurement.e2e_s.p95 is None:
        raise ValueError("a trial in which no request finished has no score")
    ratio = measurement.completed / measurement.requests if measurement.requests else 0.0
    checks: list[tuple[str, float | None, float | None, str]] = [
        ("ttft_p95_s", measurement.ttft_s.p95, bound.ttft_p95_s, "s"),
        ("e2e_p95_s", measurement.e2e_s.p95, bound.e2e_p95_s, "s"),
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
    return Score(measurement.completed_rps, measurement.e2e_s.p95, measurement.output_tps, ratio,
                 constraints, violations)
