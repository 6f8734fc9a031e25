"""End a replay as soon as what it is run to decide is certain, and never one whose outcome could still change.

Two watches share one reckoning. `BoundaryWatch`, the prune, stops a trial whose boundary is certainly broken at its
reference load. `VerdictWatch` cuts a load search's probe whose verdict (`tuner.analysis.capacity.judge_probe`) is
certainly a failure, so that an overloaded probe does not wait for every request.

"Certainly" is checked against every way the rest of the replay could go: requests not yet sent, or in flight and
not yet over a latency limit, may all meet it, and a request already over a latency limit may still fail instead
of finishing (then it counts against the completion ratio instead of the percentile).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from tuner.analysis.capacity import PERCENTILE, PERCENTILE_LIMITS, wilson_interval
from tuner.analysis.scoring import Boundary, drain_violation, late_violation
from tuner.workers.measure import Pace, early_requests
from tuner.workers.replay import InFlight, LiveReplay
from tuner.workers.request_record import Outcome, RequestRecord, prompt_thousands


def _needed_over(n: int, q: float = 0.95) -> int:
    """How many of n values must exceed a limit for their q-quantile (interpolated) to exceed it.

    The interpolated quantile lies at or above the value of rank floor((n-1) q); that value is over the limit
    once n - floor((n-1) q) values are.
    """
    return n - math.floor((n - 1) * q) if n > 0 else 1


def _quantile_over(over: int, counted: int) -> bool:
    """Whether the p95 of `counted` values, `over` of them over a limit, is over it: the trial's score."""
    return over >= _needed_over(counted)


def _share_short(over: int, counted: int) -> bool:
    """Whether `counted` values, `over` of them over a limit, fail it as a probe's verdict reads them: the upper end
    of the 95% interval of the share within it under 0.95."""
    return counted > 0 and wilson_interval(counted - over, counted)[1] < PERCENTILE


def _waited(p: InFlight, age_s: float) -> float:
    """A request in flight's time to its first token, or its time so far without one."""
    return p.first_token - p.sent if p.first_token is not None else age_s


@dataclass(frozen=True)
class _Limit:
    """A p95 limit of the boundary as a live replay is held to it."""

    name: str  # the Boundary field; its figure per request is the one the verdict reads (PERCENTILE_LIMITS)
    said: str  # what a request over it did, {} for the limit
    # A request in flight's figure so far, given the seconds since it left: a floor of the figure it ends with. None
    # where nothing is known of it before the request ends.
    so_far: Callable[[InFlight, float], float] | None


_LIMITS = (
    _Limit("e2e_p95_s", "took over {} s end to end", lambda p, age_s: age_s),
    _Limit("ttft_p95_s", "waited over {} s for a first token", _waited),
    _Limit("ttft_per_1k_prompt_p95_s", "waited over {} s per 1,000 prompt tokens for a first token",
           lambda p, age_s: _waited(p, age_s) / prompt_thousands(p.input_tokens)),
    _Limit("tpot_p95_s", "took over {} s per output token", None),  # a mean over its tokens, known once it ends
)


def _failures_left(live: LiveReplay, b: Boundary) -> int:
    """How many more requests may fail (or end truncated) before the completion ratio, as a score reads it, falls
    under the boundary's: -1 once it has, whatever the rest do."""
    if live.total == 0:
        return 0
    failed = sum(r.outcome is not Outcome.OK for r in live.finished)

    def meets(failures: int) -> bool:  # the completion ratio with so many failed in all, compared as a score does
        return (live.total - failures) / live.total >= b.min_completion_ratio

    left = math.floor(live.total * (1 - b.min_completion_ratio)) - failed  # within one of the count
    while left >= 0 and not meets(failed + left):
        left -= 1
    while failed + left + 1 <= live.total and meets(failed + left + 1):
        left += 1
    return max(left, -1)


def _latency_over(live: LiveReplay, b: Boundary, left: int, fails: Callable[[int, int], bool]) -> str | None:
    """The first p95 limit that `fails(over, counted)` breaks however the rest of the replay goes, as the requests
    over it already; None while none is.

    The kindest ending is tried: every request not yet over the limit ends within it, and each already over it
    finishes over it or, within the `left` failures the completion ratio allows, fails, leaving the percentile. A
    request within a limit is kinder than one that fails: the share within it and its interval's upper end only
    grow with it, and so does the number of values over it that push a p95 over."""
    now = live.elapsed()
    ages = [(p, now - (p.sent - live.origin)) for p in live.in_flight.values()]
    for limit in _LIMITS:
        value = getattr(b, limit.name)
        if value is None:
            continue
        figure = PERCENTILE_LIMITS[limit.name]
        counted = [v for r in live.finished if (v := getattr(r, figure)) is not None and r.e2e_s is not None]
        over = sum(v > value for v in counted)
        pending = sum(limit.so_far(p, age_s) > value for p, age_s in ages) if limit.so_far is not None else 0
        most = live.total - (len(live.finished) - len(counted))  # the values the percentile can hold at most
        if all(fails(over + pending - k, most - k) for k in range(min(pending, left) + 1)):
            return f"{over + pending} requests already {limit.said.format(f'{value:g}')}"
    return None


def _certain_failure(live: LiveReplay, b: Boundary, fails: Callable[[int, int], bool], consequence: str,
                     span_s: float) -> str | None:
    """Why the replay certainly breaks the boundary's completion ratio, a p95 limit (as `fails` reads it, with its
    `consequence` in words) or its makespan over `span_s` of arrivals; None while it may still meet them."""
    left = _failures_left(live, b)
    if left < 0:
        failed = sum(r.outcome is not Outcome.OK for r in live.finished)
        return (f"{failed} of {live.total} requests already failed: the completion ratio cannot reach "
                f"{b.min_completion_ratio:g}")
    if (over := _latency_over(live, b, left, fails)) is not None:
        return f"{over}: {consequence}"
    makespan = b.makespan_limit_s(span_s)
    if makespan is not None and live.elapsed() > makespan and len(live.finished) < live.total:
        return f"the replay is past its makespan limit of {makespan:.1f} s with requests unfinished"
    return None


@dataclass(frozen=True)
class BoundaryWatch:
    """Decides, from a live replay, whether its trial can still meet the boundary."""

    boundary: Boundary

    def __call__(self, live: LiveReplay) -> str | None:
        """A reason to stop now, or None while the boundary can still be met."""
        return _certain_failure(live, self.boundary, _quantile_over, "p95 cannot meet it", live.span_s)


@dataclass(frozen=True)
class VerdictWatch:
    """Decides, from a live probe of a load search, whether its verdict is certainly a failure by the rules
    `judge_probe` applies to the whole probe: a p95 limit whose share of requests within it cannot reach 0.95 by
    its 95% interval, a completion ratio out of reach, a makespan passed, or a pace rule already broken."""

    boundary: Boundary

    def __call__(self, live: LiveReplay) -> str | None:
        """A reason to cut the probe now, or None while its verdict may still be a pass or inconclusive."""
        b = self.boundary
        # The verdict holds a probe's makespan to its own arrival window, the last request's scheduled offset.
        window_s = max(live.due_s.values(), default=0.0)
        return (_certain_failure(live, b, _share_short, f"the share within it cannot reach {PERCENTILE:g}", window_s)
                or _behind(live, _failures_left(live, b), window_s))


def _behind(live: LiveReplay, left: int, window_s: float) -> str | None:
    """A pace rule (`scoring.pace_violations`) the live probe breaks already, whatever the rest do. Both rules
    measure against the early requests' p90 latency (`Pace.lag_s`), known once they have all ended; and both
    decide only after the arrival window, `window_s`.

    The drain rule is decided once a response came, or one of the requests unfinished (more than `left` of them
    can fail) must come, later than it allows. The late-requests rule is decided in the form that needs most of
    the window's later requests late, once every request that could count as served in time has. Its other form,
    many of them late while the latency grew, is not: the growth is read from the last third's latency, known once
    they end, or from the share served per copy of the trace, a copy's length untold here."""
    now = live.elapsed()
    if window_s <= 0 or now <= window_s:
        return None
    finished = {r.index: r for r in live.finished}
    records = [finished.get(i) or RequestRecord(i, due_s, None, 0, 0, 0, Outcome.NOT_SENT)
               for i, due_s in sorted(live.due_s.items())]
    if any(r.index not in finished for r in early_requests(records)):
        return None
    pace = Pace.of(records)  # its lag, window and arrivals those of the whole probe; its drain a floor of the last
    if live.total - len(finished) > left:
        pace = replace(pace, drain_s=max(now - window_s, pace.drain_s if pace.drain_s is not None else -math.inf))
    if (drained := drain_violation(pace)) is not None:
        return drained
    if now > window_s + pace.lag_s:
        return late_violation(replace(pace, e2e_trend=None, carried_share=None), grew=False)
    return None
