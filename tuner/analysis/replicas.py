"""Replicas for the user's own traffic: how many copies of one configuration carry a rate within the boundary, with
the range a capacity's interval gives, hour by hour over a day, and what they cost.

Pure arithmetic on capacities and rates (req/s): it reads no storage and launches nothing. A replica is planned to
run at `headroom` of its measured capacity, so that the plan does not sit on the boundary's edge; at least one
replica always stays up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.common.errors import TunerError

DEFAULT_HEADROOM = 0.8
DEFAULT_PEAK_WINDOW_S = 60.0
HOURS = 24
# A ratio this close above a whole number is that number (10 / (12.5 * 0.8) is 1.0000000000000002 in floats).
WHOLE = 1e-9
# No rate or price is larger (req/s, US dollars): beyond it the day's sums would overflow a float.
LARGEST = 1e12


@dataclass(frozen=True)
class MeasuredCapacity:
    """What one configuration carries within the boundary, req/s: the central value, its 95% interval and the
    launches behind it (1: measured once, the interval being the value itself)."""

    rps: float
    low: float
    high: float  # infinite where no failing load bounded it above
    launches: int

    @classmethod
    def once(cls, rps: float) -> MeasuredCapacity:
        """A capacity the search measured once: no interval."""
        return cls(rps, rps, rps, 1)

    @property
    def measured_once(self) -> bool:
        """Whether a single launch measured it (no interval can be given)."""
        return self.launches < 2

    def text(self) -> str:
        """`8.1 req/s (95% CI 7.6-8.7, 3 launches)`, `8.1 req/s (measured once)`."""
        if self.measured_once:
            return f"{self.rps:.3g} req/s (measured once)"
        high = "or more" if math.isinf(self.high) else f"{self.high:.3g}"
        return f"{self.rps:.3g} req/s (95% CI {self.low:.3g}-{high}, {self.launches} launches)"

    def to_dict(self) -> dict[str, Any]:
        """For programs: the value, the interval's ends (high None where unbounded), the launches."""
        return {"rps": self.rps, "low": self.low, "high": None if math.isinf(self.high) else self.high,
                "launches": self.launches, "measured_once": self.measured_once}


@dataclass(frozen=True)
class ReplicaCount:
    """Replicas that carry a rate: `low` at the capacity's high end, `high` at its low end (equal when it was
    measured once, or when the interval does not change the count)."""

    low: int
    high: int

    def text(self) -> str:
        """`8 replicas`, `8 to 9 replicas`, `1 replica`."""
        if self.low == self.high:
            return f"{self.low} replica{'s' if self.low != 1 else ''}"
        return f"{self.low} to {self.high} replicas"

    def to_dict(self) -> dict[str, Any]:
        """For programs: both ends."""
        return {"low": self.low, "high": self.high}


def check_headroom(headroom: float) -> float:
    """The share of a replica's capacity a plan uses; TunerError unless it is in (0, 1]."""
    if not 0 < headroom <= 1:
        raise TunerError(f"--headroom must be above 0 and at most 1 (the share of a replica's capacity used), "
                         f"got {headroom:g}")
    return headroom


def check_price(usd_per_gpu_hour: float | None) -> float | None:
    """A price per GPU-hour as given; TunerError for zero, a negative one or one past any price (None: no price
    given)."""
    if usd_per_gpu_hour is not None and not 0 < usd_per_gpu_hour <= LARGEST:
        raise TunerError(f"--gpu-hour-cost must be above 0 (US dollars per GPU-hour), got {usd_per_gpu_hour:g}")
    return usd_per_gpu_hour


def check_rate(option: str, rps: float, zero: bool = False) -> float:
    """A rate as given, req/s: above 0 (or 0 with `zero`) and finite; TunerError naming `option` otherwise."""
    if not (0 <= rps <= LARGEST if zero else 0 < rps <= LARGEST):
        raise TunerError(f"{option} must be {'0 or more' if zero else 'above 0'} req/s, got {rps:g}")
    return rps


def _replicas(rate_rps: float, capacity_rps: float, headroom: float) -> int:
    if math.isinf(capacity_rps):
        return 1
    return max(1, math.ceil(rate_rps / (capacity_rps * headroom) - WHOLE))


def replicas_for(rate_rps: float, capacity: MeasuredCapacity, headroom: float = DEFAULT_HEADROOM) -> ReplicaCount:
    """ceil(rate / (capacity x headroom)) at each end of the capacity's interval, at least 1."""
    check_headroom(headroom)
    return ReplicaCount(_replicas(rate_rps, capacity.high, headroom), _replicas(rate_rps, capacity.low, headroom))


@dataclass(frozen=True)
class PeakRate:
    """The busiest stretch of a trace: its rate, where it starts and how long it is (0 for a rate given by hand)."""

    rps: float
    start_s: float
    window_s: float

    def to_dict(self) -> dict[str, Any]:
        """For programs: every field."""
        return {"rps": self.rps, "start_s": self.start_s, "window_s": self.window_s}


def busiest_window(arrivals_s: Sequence[float], window_s: float) -> PeakRate:
    """The most arrivals within any `window_s` seconds (from one arrival on), as a rate; a trace shorter than the
    window counts over the window all the same, as its traffic would arrive at that rate."""
    if not 0 < window_s < math.inf:
        raise TunerError(f"--peak-window must be above 0 seconds, got {window_s:g}")
    if not arrivals_s:
        raise TunerError("the trace has no arrivals to take a peak from")
    times = sorted(arrivals_s)
    best, start, end = 0, 0.0, 0
    for first, t in enumerate(times):
        end = max(end, first)
        while end < len(times) and times[end] < t + window_s:
            end += 1
        if end - first > best:
            best, start = end - first, t
    return PeakRate(best / window_s, start, window_s)


def hourly_rates(arrivals_s: Sequence[float]) -> tuple[float, ...] | None:
    """The mean rate in each hour of the day (hour 0: the trace's first hour), req/s, over the trace's whole hours,
    an hour of the day seen on several days averaged over them; None for a trace spanning less than 24 hours."""
    if not arrivals_s:
        return None
    first = min(arrivals_s)
    whole_hours = int((max(arrivals_s) - first) // 3600)
    if whole_hours < HOURS:
        return None
    counts = [0] * whole_hours
    for t in arrivals_s:
        hour = int((t - first) // 3600)
        if hour < whole_hours:  # the last, partial hour would read as a quiet one
            counts[hour] += 1
    days = [[c for k, c in enumerate(counts) if k % HOURS == h] for h in range(HOURS)]
    return tuple(sum(seen) / len(seen) / 3600 for seen in days)


def read_hourly_rates(path: str, text: str) -> tuple[float, ...]:
    """A day's rates from CSV text `hour,rps` (a header line optional): 24 rows, hours 0 to 23 once each, rates of 0
    or more; TunerError naming the file and line otherwise."""
    rates: dict[int, float] = {}
    rows = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if rows and rows[0][1].replace(" ", "").lower() == "hour,rps":
        rows = rows[1:]
    for n, line in rows:
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) != 2:
                raise ValueError
            hour, rps = int(parts[0]), float(parts[1])
        except ValueError:
            raise TunerError(f"{path}, line {n}: expected `hour,rps` (an hour 0-23 and a rate), got {line!r}") from None
        if not 0 <= hour < HOURS or hour in rates:
            why = "listed twice" if hour in rates else "not an hour 0-23"
            raise TunerError(f"{path}, line {n}: hour {hour} is {why}")
        rates[hour] = check_rate(f"{path}, line {n}: the rate", rps, zero=True)
    if len(rates) != HOURS:
        missing = ", ".join(str(h) for h in range(HOURS) if h not in rates)
        raise TunerError(f"{path}: a day needs 24 rows, one per hour 0-23; missing hours {missing}")
    return tuple(rates[h] for h in range(HOURS))


@dataclass(frozen=True)
class DayPlan:
    """One configuration over a day: replicas hour by hour, the GPU-hours (or CPU slot-hours) they hold, and at a
    price per GPU-hour their cost, per day and per million output tokens."""

    replicas: tuple[ReplicaCount, ...]  # per hour of the day
    slot_hours: tuple[float, float]  # (low, high): replicas x slots per replica, summed over the hours
    cost_usd: tuple[float, float] | None  # per day; None without a price
    cost_per_million_tokens_usd: tuple[float, float] | None  # None without a price or output tokens

    def to_dict(self) -> dict[str, Any]:
        """For programs: replicas per hour, slot-hours and costs as [low, high]."""
        return {"replicas": [r.to_dict() for r in self.replicas], "slot_hours": list(self.slot_hours),
                "cost_usd": list(self.cost_usd) if self.cost_usd else None,
                "cost_per_million_tokens_usd": (list(self.cost_per_million_tokens_usd)
                                                if self.cost_per_million_tokens_usd else None)}


def day_plan(rates_rps: Sequence[float], capacity: MeasuredCapacity, headroom: float, slots_per_replica: int,
             price_usd: float | None, output_tokens_per_request: float | None) -> DayPlan:
    """Replicas for each hour's rate, slot-hours = sum of replicas x `slots_per_replica` over the hours, cost =
    slot-hours x `price_usd`, and cost per million output tokens = the day's cost / (the day's requests x
    `output_tokens_per_request` / 1e6)."""
    check_price(price_usd)
    hourly = tuple(replicas_for(rate, capacity, headroom) for rate in rates_rps)
    slot_hours = (float(sum(r.low for r in hourly) * slots_per_replica),
                  float(sum(r.high for r in hourly) * slots_per_replica))
    cost = (slot_hours[0] * price_usd, slot_hours[1] * price_usd) if price_usd is not None else None
    tokens = sum(rates_rps) * 3600 * (output_tokens_per_request or 0)
    per_million = (cost[0] / (tokens / 1e6), cost[1] / (tokens / 1e6)) if cost is not None and tokens > 0 else None
    return DayPlan(hourly, slot_hours, cost, per_million)
