"""Whether an engine kept up, read from the same request replayed twice in one probe, beside the pace rule's trend.

A probe repeats the trace until it holds enough requests, so request i of the first copy and request i of the
second are the same request (same prompt and output lengths) sent at two times. The pace rule compares the median
end-to-end latency of the last third of a probe's requests with the first third's: different requests, whose
output lengths may differ (the bundled Azure cut's first 300 requests: median 183 output tokens early, 388 late).
The paired ratio, e2e of the second copy over the first, is free of that: near 1 when the engine kept up, and
growing in its upper quantiles when a queue or the batch grew.

    .venv/bin/python benchmarks/pace_paired.py TRIALS_DIR [--period 300] [--boundary interactive] [--json out.json]

TRIALS_DIR holds trial folders with their requests.csv (a study's `artifacts/trials/NAME`). Prints, per probe
with two copies or more, the offered load, the rule's trend, the early and late median output lengths, and the
paired ratio's median, p75 and p90; then the share of a copy's requests served per span one copy long
(`Pace.carried_share`), and the pace verdict of the trend rule (before 2026-12-06) and of the rule as it stands,
which reads that share: "fail" (did not keep up), "undecided" (too short to tell) or "pass"; and the probe's whole
verdict now under --boundary (the percentile limits too; an early stop or a lost engine, which requests.csv does
not say, aside).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.analysis.capacity import judge_probe  # noqa: E402
from tuner.analysis.scoring import BOUNDARIES, Boundary, boundary, pace_undecided, pace_violations  # noqa: E402
from tuner.workers.measure import Pace, measure  # noqa: E402
from tuner.workers.probes import Probe  # noqa: E402
from tuner.workers.replay import ReplayResult  # noqa: E402
from tuner.workers.request_record import Outcome, RequestRecord  # noqa: E402


@dataclass(frozen=True)
class PairedProbe:
    """One probe's requests read two ways: the rule's trend across thirds, and the same request's two sends."""

    trial: str
    probe: int
    offered_rps: float
    requests: int
    e2e_trend: float  # median e2e of the last third over the first third's (what the pace rule reads)
    output_early: float  # median output tokens of the first third
    output_late: float  # ... and of the last third
    pairs: int
    paired_median: float
    paired_p75: float
    paired_p90: float
    carried_share: float | None  # requests served per span one copy long, over a copy's (Pace.carried_share)
    trend_rule: str  # the pace verdict with "grew" read from the trend, as before 2026-12-06
    rule_now: str  # ... and from the carried share, as tuner.analysis.scoring.pace_violations reads it now
    judged_now: str  # the probe's verdict now (tuner.analysis.capacity.judge_probe), the percentile limits included


def _third_median(rows: list[dict], column: str, last: bool) -> float:
    """The median of `column` over the first or last third of `rows`; NaN where none has it (a stopped probe)."""
    third = len(rows) // 3
    values = [float(r[column]) for r in (rows[-third:] if last else rows[:third]) if r[column]]
    return statistics.median(values) if values else float("nan")


def _pace_verdict(pace: Pace | None) -> str:
    """The pace rule's verdict on one probe: fail, undecided or pass."""
    return "fail" if pace_violations(pace) else "undecided" if pace_undecided(pace) else "pass"


def _records(rows: list[dict]) -> list[RequestRecord]:
    """The probe's requests as the replayer recorded them (requests.csv's columns)."""
    def number(value: str) -> float | None:
        return float(value) if value else None

    return [RequestRecord(int(r["index"]), float(r["scheduled_s"]), number(r["sent_s"]), int(r["requested_tokens"]),
                          int(r["input_tokens"]), int(r["output_tokens"]), Outcome(r["outcome"]),
                          ttft_s=number(r["ttft_s"]), e2e_s=number(r["e2e_s"])) for r in rows]


def paired_probes(requests_csv: Path, period: int, bound: Boundary) -> list[PairedProbe]:
    """Every probe of one trial's requests.csv holding at least two copies of a `period`-request trace, with
    at least 20 pairs of the same request served twice."""
    rows = list(csv.DictReader(requests_csv.open()))
    found = []
    for probe in sorted({int(r["probe"]) for r in rows}):
        mine = sorted((r for r in rows if int(r["probe"]) == probe), key=lambda r: int(r["index"]))
        pairs = [float(mine[i + period]["e2e_s"]) / float(mine[i]["e2e_s"]) for i in range(len(mine) - period)
                 if mine[i]["e2e_s"] and mine[i + period]["e2e_s"]]
        if len(pairs) < 20:
            continue
        by_schedule = sorted(mine, key=lambda r: float(r["scheduled_s"]))
        window = float(by_schedule[-1]["scheduled_s"])
        deciles = statistics.quantiles(pairs, n=20)
        records = _records(mine)
        duration = max((r.sent_s + r.e2e_s for r in records if r.sent_s is not None and r.e2e_s is not None),
                        default=window)
        measured = measure(ReplayResult(records, duration, None, None), period)
        pace = measured.pace
        judged = judge_probe(Probe(probe, 1.0, 0, len(records), measured), records, bound)
        found.append(PairedProbe(
            trial=requests_csv.parent.name, probe=probe, offered_rps=len(mine) / window, requests=len(mine),
            e2e_trend=_third_median(by_schedule, "e2e_s", True) / _third_median(by_schedule, "e2e_s", False),
            output_early=_third_median(by_schedule, "output_tokens", False),
            output_late=_third_median(by_schedule, "output_tokens", True), pairs=len(pairs),
            paired_median=statistics.median(pairs), paired_p75=deciles[14], paired_p90=deciles[17],
            carried_share=pace.carried_share, trend_rule=_pace_verdict(replace(pace, carried_share=None)),
            rule_now=_pace_verdict(pace), judged_now=judged.verdict.value))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", type=Path, help="folder of trial folders, each with a requests.csv")
    parser.add_argument("--period", type=int, default=300, help="requests in one copy of the replayed trace")
    parser.add_argument("--boundary", choices=sorted(BOUNDARIES), default="interactive",
                        help="the boundary the probes were judged under")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    bound = boundary(args.boundary)
    probes = [p for path in sorted(args.trials.glob("*/requests.csv")) for p in paired_probes(path, args.period, bound)]
    print("trial        probe  offered  e2e trend  output early/late  pairs  paired median  p75   p90   carried  "
          "trend rule  rule now   judged now")
    for p in probes:
        carried = "-" if p.carried_share is None else f"{p.carried_share:.2f}"
        print(f"{p.trial:<12} {p.probe:>5}  {p.offered_rps:7.2f}  {p.e2e_trend:9.2f}  {p.output_early:7.0f} / "
              f"{p.output_late:<7.0f}  {p.pairs:5d}  {p.paired_median:13.2f}  {p.paired_p75:4.2f}  "
              f"{p.paired_p90:4.2f}  {carried:>7}  {p.trend_rule:<10}  {p.rule_now:<9}  {p.judged_now}")
    if args.json:
        args.json.write_text(json.dumps([asdict(p) for p in probes], indent=1) + "\n")


if __name__ == "__main__":
    main()
