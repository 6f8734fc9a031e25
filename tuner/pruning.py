"""Stop a trial as soon as its boundary is certainly violated, and never one that could still meet it.

"Certainly" is checked against every way the rest of the replay could go: requests not yet sent may all be
fast, and a request already over a latency limit may still fail instead of finishing (then it counts against
the completion ratio instead of the percentile).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tuner.scoring import Boundary
from tuner.workers.replay import LiveReplay, Outcome, prompt_thousands


_FINISHED = (Outcome.OK, Outcome.TRUNCATED)


def _needed_over(n: int, q: float = 0.95) -> int:
    """How many of n values must exceed a limit for their q-quantile (interpolated) to exceed it.

    The interpolated quantile lies at or above the value of rank floor((n-1) q); that value is over the limit
    once n - floor((n-1) q) values are.
    """
    return n - math.floor((n - 1) * q) if n > 0 else 1


def _quantile_certainly_over(over_final: int, over_pending: int, failed: int, total: int,
                             failure_budget: int) -> bool:
    """Over the limit whatever the pending-over requests do: each either finishes (adding to the values over
    the limit) or fails (removing itself from the percentile, spending failure budget)."""
    for k in range(0, min(over_pending, failure_budget) + 1):  # k of them fail
        finished_at_most = total - failed - k
        if over_final + over_pending - k < _needed_over(finished_at_most):
            return False
    return True


def _ttft_allowances(b: Boundary) -> list[tuple[str, Callable[[int], float]]]:
    """The boundary's TTFT limits, each as its text and the seconds it allows a request of so many prompt tokens."""
    allowances: list[tuple[str, Callable[[int], float]]] = []
    if (flat := b.ttft_p95_s) is not None:
        allowances.append((f"{flat:g} s", lambda _tokens: flat))
    if (per_1k := b.ttft_per_1k_prompt_p95_s) is not None:
        allowances.append((f"{per_1k:g} s per 1,000 prompt tokens",
                           lambda tokens: per_1k * prompt_thousands(tokens)))
    return allowances


@dataclass(frozen=True)
class BoundaryWatch:
    """Decides, from a live replay, whether its trial can still meet the boundary."""

    boundary: Boundary

    def __call__(self, live: LiveReplay) -> str | None:
        """A reason to stop now, or None while the boundary can still be met."""
        b, total = self.boundary, live.total
        failure_budget = math.floor(total * (1 - b.min_completion_ratio) + 1e-9)
        finished = live.finished
        failed = sum(r.outcome is not Outcome.OK for r in finished)
        # Truncated requests finished (they count in the percentiles) but were not served in full.
        dropped = sum(r.outcome not in _FINISHED for r in finished)
        if failed > failure_budget:
            return (f"{failed} of {total} requests already failed: the completion ratio cannot reach "
                    f"{b.min_completion_ratio:g}")
        left = failure_budget - failed
        now = live.elapsed()
        started = {i: p.sent - live.origin for i, p in live.in_flight.items()}
        if b.e2e_p95_s is not None:
            limit = b.e2e_p95_s
            over = sum(r.e2e_s is not None and r.e2e_s > limit for r in finished)
            pending = sum(now - sent > limit for sent in started.values())
            if _quantile_certainly_over(over, pending, dropped, total, left):
                return f"{over + pending} requests already took over {limit:g} s end to end: p95 cannot meet it"
        # The TTFT percentile is over requests that finished with a first token: (its TTFT, its prompt's length).
        counted = [(r.ttft_s, r.input_tokens) for r in finished if r.outcome in _FINISHED and r.ttft_s is not None]
        for shown, allowed_s in _ttft_allowances(b):
            over = sum(ttft_s > allowed_s(tokens) for ttft_s, tokens in counted)
            pending = sum(
                (p.first_token is None and now - (p.sent - live.origin) > allowed_s(p.input_tokens))
                or (p.first_token is not None and p.first_token - p.sent > allowed_s(p.input_tokens))
                for p in live.in_flight.values())
            if _quantile_certainly_over(over, pending, len(finished) - len(counted), total, left):
                return f"{over + pending} requests already waited over {shown} for a first token: p95 cannot meet it"
        makespan = b.makespan_limit_s(live.span_s)
        if makespan is not None and now > makespan and len(finished) < total:
            return f"the replay is past its makespan limit of {makespan:.1f} s with requests unfinished"
        return None

