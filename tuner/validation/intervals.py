"""The statistics of a validation: a gain between two arms with its 95% interval (`gain_interval`), and one arm's
capacity over its launches (`capacity_interval`)."""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.analysis.replicas import MeasuredCapacity


CONFIDENCE = 0.95


@dataclass(frozen=True)
class GainInterval:
    """A ratio of two configurations' carried loads (the geometric means of their repeats) with its 95%
    confidence interval (Welch's t on the log values, or the paired t on the rounds' log ratios) and the repeats
    behind each side."""

    ratio: float
    low: float
    high: float
    repeats: tuple[int, int]  # (the compared configuration's, the reference's)
    paired: bool = False  # from paired rounds (the repeats are rounds, equal on both sides)

    @property
    def includes_one(self) -> bool:
        """Whether the measurement cannot tell the two apart (an end at 1 up to rounding counts)."""
        return self.low <= 1.0 + 1e-9 and self.high >= 1.0 - 1e-9

    def text(self) -> str:
        """`x1.02, 95% CI 0.97-1.07, 3 repeats each`; ends that no failing load bounded read `0-1.41` and `1.17 or
        more`."""
        a, b = self.repeats
        each = f"{a} paired rounds" if self.paired else f"{a} repeats each" if a == b else f"{a} and {b} repeats"
        low = "0" if self.low == 0 else f"{self.low:.2f}"
        ends = f"{low} or more" if math.isinf(self.high) else f"{low}-{self.high:.2f}"
        return f"x{self.ratio:.2f}, {CONFIDENCE:.0%} CI {ends}, {each}"

    def to_dict(self) -> dict[str, Any]:
        """For programs: the ratio, the interval's ends (the high one None where unbounded), the repeats, whether
        they were paired rounds, and the confidence level."""
        return {"ratio": self.ratio, "low": self.low, "high": None if math.isinf(self.high) else self.high,
                "repeats": list(self.repeats), "paired": self.paired, "confidence": CONFIDENCE}


def gain_interval(values: Sequence[float], reference: Sequence[float], resolution: float = 0.0,
                  brackets: tuple[float, float] = (0.0, 0.0), paired: bool = False) -> GainInterval:
    """How much more `values` carries than `reference` (every value above 0, at least 2 of each): the ratio of
    geometric means and its Welch t-interval on the logs or, `paired` (values[i] measured beside reference[i], in
    one round), the paired t-interval on the rounds' log ratios, which drift common to a round cancels from;
    either widened where narrower to the measurement's
    `resolution` (a load search tells apart no capacities within its precision: 0.1 = 10%), which repeats that
    happen to agree cannot make finer. `brackets`: how far above the geometric mean of its values each side's
    may lie (`ArmResult.bracket`: 0.42 for searches that passed 16.3 req/s and failed 23.1; infinite where no
    load above a capacity failed): a search whose probes ran out before its precision leaves the capacity
    anywhere in its bracket, so the gain's low end takes the reference's bracket (down to 0 for an open one) and
    its high end the compared side's (up to infinity)."""
    # lazy: keeps the CLI's start fast (SciPy)
    from scipy import stats

    if min(len(values), len(reference)) < 2 or min(*values, *reference) <= 0:
        raise ValueError("an interval needs at least 2 values above 0 on each side")
    if paired and len(values) != len(reference):
        raise ValueError("paired values come in pairs: one of each side per round")
    logs_a, logs_b = [math.log(v) for v in values], [math.log(v) for v in reference]
    diff = statistics.fmean(logs_a) - statistics.fmean(logs_b)
    # What the t-test sees vary: the rounds' log ratios when paired, else each side's repeats.
    spread = (len({a - b for a, b in zip(logs_a, logs_b)}) > 1 if paired
              else len(set(logs_a)) > 1 or len(set(logs_b)) > 1)
    if not spread:  # identical ratios, or identical repeats on both sides: nothing to widen by
        low = high = diff
    else:
        # Repeats of one side that agree exactly are common (capacities lie on the search's grid of loads): scipy
        # warns of a precision loss there, but their variance is exactly 0 and the interval is right.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
            test = stats.ttest_rel(logs_a, logs_b) if paired else stats.ttest_ind(logs_a, logs_b, equal_var=False)
            interval = test.confidence_interval(CONFIDENCE)
        low, high = float(interval.low), float(interval.high)
    above, below = (math.log1p(max(resolution, bracket)) for bracket in brackets)
    return GainInterval(math.exp(diff), math.exp(min(low, diff - below)), math.exp(max(high, diff + above)),
                        (len(values), len(reference)), paired)


def capacity_interval(values: Sequence[float], resolution: float = 0.0, bracket: float = 0.0) -> MeasuredCapacity:
    """What one configuration carries over its launches (every value above 0, at least 2): the geometric mean and
    its t-interval on the logs, the one way this module computes intervals (`gain_interval`), widened where
    narrower to the load search's `resolution` below and to `max(resolution, bracket)` above (`ArmResult.bracket`:
    the capacity may lie anywhere below the first load that failed)."""
    # lazy: keeps the CLI's start fast (SciPy)
    from scipy import stats

    if len(values) < 2 or min(values) <= 0:
        raise ValueError("an interval needs at least 2 values above 0")
    logs = [math.log(v) for v in values]
    mean = statistics.fmean(logs)
    low = high = mean
    if len(set(logs)) > 1:
        interval = stats.t.interval(CONFIDENCE, len(logs) - 1, loc=mean, scale=stats.sem(logs))
        low, high = float(interval[0]), float(interval[1])
    below, above = math.log1p(resolution), math.log1p(max(resolution, bracket))
    return MeasuredCapacity(math.exp(mean), math.exp(min(low, mean - below)), math.exp(max(high, mean + above)),
                            len(values))
