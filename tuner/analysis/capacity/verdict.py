"""Each probe judged against the boundary: pass, fail or inconclusive, with the reasons (`judge_probe`), and the
probe kept with its verdict (`JudgedProbe`).

A probe passes when the boundary holds *and* the engine kept up with the arrivals: a load that grows a queue a
longer run would never drain fails even when its percentiles look fine. A percentile decision within noise (the
95% interval of the share of requests meeting a limit holds the boundary's 0.95) is inconclusive, and so is a
probe too short for its own latencies to show the pace (`scoring.pace_undecided`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tuner.analysis.scoring import Boundary, pace_undecided, pace_violations, score
from tuner.workers.probes import Probe, ProbeRun
from tuner.workers.request_record import RequestRecord

PERCENTILE = 0.95  # every latency limit of a boundary is on the p95
WILSON_Z = 1.96  # 95% intervals


class Verdict(StrEnum):
    """What one probe says about its load."""

    PASS = "pass"  # within the boundary, and kept up
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # a percentile within noise of its limit, or a pace not shown: the bracket's edge


@dataclass(frozen=True)
class ProbeJudgement:
    """A probe's verdict and, unless it passed, why."""

    verdict: Verdict
    reasons: list[str]


def wilson_interval(k: int, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval of a share k/n (n > 0)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _percentile_decision(name: str, values: list[float], limit: float) -> tuple[Verdict, str | None]:
    """Whether the p95 of `values` meets `limit`, told apart from noise by the share of values within it."""
    if not values:
        return Verdict.PASS, None
    k = sum(v <= limit for v in values)
    lo, hi = wilson_interval(k, len(values))
    share = f"{k} of {len(values)} requests within {limit:g} s (95% CI {lo:.3f}-{hi:.3f})"
    if lo >= PERCENTILE:
        return Verdict.PASS, None
    if hi < PERCENTILE:
        return Verdict.FAIL, f"{name}: {share}"
    return Verdict.INCONCLUSIVE, f"{name} within noise of its limit: {share}"


# The limits on a p95 that a probe is judged on request by request (within noise or not), with the request figure
# each is taken from.
PERCENTILE_LIMITS = {"ttft_p95_s": "ttft_s", "e2e_p95_s": "e2e_s", "tpot_p95_s": "itl_mean_s",
                     "ttft_per_1k_prompt_p95_s": "ttft_per_1k_prompt_s"}
# n requests all within a limit tell a p95 from it only from here on: the lower end of the Wilson interval of n of
# n, n / (n + z^2), reaches PERCENTILE at n = PERCENTILE z^2 / (1 - PERCENTILE), that is 73.
DECISIVE_REQUESTS = math.ceil(PERCENTILE * WILSON_Z ** 2 / (1 - PERCENTILE))


def judge_probe(probe: Probe, records: Sequence[RequestRecord], bound: Boundary) -> ProbeJudgement:
    """Pass, fail or inconclusive for one probe, from its measurement and its requests, with the reasons."""
    m = probe.measurement
    if m is None or probe.engine_lost:
        return ProbeJudgement(Verdict.FAIL, ["the engine died during the probe"])
    if probe.stop_reason is not None:
        return ProbeJudgement(Verdict.FAIL, [f"stopped early: {probe.stop_reason}"])
    # tuner.search.pruning.VerdictWatch: a failure by the rules below, whatever followed
    if probe.cut_by_verdict is not None:
        return ProbeJudgement(Verdict.FAIL, [f"cut by its verdict: {probe.cut_by_verdict}"])
    if m.e2e_s.p95 is None:
        return ProbeJudgement(Verdict.FAIL, ["no request finished"])
    verdicts: list[Verdict] = []
    reasons: list[str] = []
    # Scored with the percentile limits lifted, so that every violation left is one of the others; the pace apart,
    # since a pace the probe could not show is inconclusive here, not a failure.
    others = score(m, bound.with_limits({name: None for name in PERCENTILE_LIMITS}), m.pace.window_s if m.pace else 0.0)
    for name, figure in PERCENTILE_LIMITS.items():
        limit = getattr(bound, name)
        if limit is None:
            continue
        values = [getattr(r, figure) for r in records if getattr(r, figure) is not None and r.e2e_s is not None]
        verdict, reason = _percentile_decision(name, values, limit)
        verdicts.append(verdict)
        if reason:
            reasons.append(reason)
    for violation in others.violations + pace_violations(m.pace):  # completion, makespan, pace: no noise to be within
        verdicts.append(Verdict.FAIL)
        reasons.append(violation)
    if Verdict.FAIL in verdicts:
        return ProbeJudgement(Verdict.FAIL, reasons)
    if (undecided := pace_undecided(m.pace)) is not None:
        verdicts.append(Verdict.INCONCLUSIVE)
        reasons.append(undecided)
    if Verdict.INCONCLUSIVE in verdicts:
        return ProbeJudgement(Verdict.INCONCLUSIVE, reasons)
    return ProbeJudgement(Verdict.PASS, [])


@dataclass(frozen=True)
class JudgedProbe:
    """A probe with its verdict: what a trial keeps of each."""

    probe: Probe
    verdict: Verdict
    reasons: list[str]

    @classmethod
    def of(cls, run: ProbeRun, bound: Boundary) -> JudgedProbe:
        """A probe that ran, judged against the boundary."""
        judgement = judge_probe(run.probe, run.records, bound)
        return cls(run.probe, judgement.verdict, judgement.reasons)

    def to_dict(self) -> dict[str, Any]:
        """As stored."""
        return {**self.probe.to_dict(), "verdict": self.verdict.value, "reasons": self.reasons}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JudgedProbe:
        """The judged probe `to_dict` gave."""
        rest = {k: v for k, v in data.items() if k not in ("verdict", "reasons")}
        return cls(Probe.from_dict(rest), Verdict(data["verdict"]), list(data["reasons"]))
