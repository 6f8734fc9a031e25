"""Whether an engine kept up, read from the same request replayed twice in one probe, beside the pace rule's trend.

A probe repeats the trace until it holds enough requests, so request i of the first copy and request i of the
second are the same request (same prompt and output lengths) sent at two times. The pace rule compares the median
end-to-end latency of the last third of a probe's requests with the first third's: different requests, whose
output lengths may differ (the bundled Azure cut's first 300 requests: median 183 output tokens early, 388 late).
The paired ratio, e2e of the second copy over the first, is free of that: near 1 when the engine kept up, and
growing in its upper quantiles when a queue or the batch grew.

    .venv/bin/python benchmarks/pace_paired.py TRIALS_DIR [--period 300] [--json out.json]

TRIALS_DIR holds trial folders with their requests.csv (a study's `artifacts/trials/NAME`). Prints, per probe
with two copies or more, the offered load, the rule's trend, the early and late median output lengths, and the
paired ratio's median, p75 and p90.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path


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


def _third_median(rows: list[dict], column: str, last: bool) -> float:
    """The median of `column` over the first or last third of `rows`; NaN where none has it (a stopped probe)."""
    third = len(rows) // 3
    values = [float(r[column]) for r in (rows[-third:] if last else rows[:third]) if r[column]]
    return statistics.median(values) if values else float("nan")


def paired_probes(requests_csv: Path, period: int) -> list[PairedProbe]:
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
        found.append(PairedProbe(
            trial=requests_csv.parent.name, probe=probe, offered_rps=len(mine) / window, requests=len(mine),
            e2e_trend=_third_median(by_schedule, "e2e_s", True) / _third_median(by_schedule, "e2e_s", False),
            output_early=_third_median(by_schedule, "output_tokens", False),
            output_late=_third_median(by_schedule, "output_tokens", True), pairs=len(pairs),
            paired_median=statistics.median(pairs), paired_p75=deciles[14], paired_p90=deciles[17]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", type=Path, help="folder of trial folders, each with a requests.csv")
    parser.add_argument("--period", type=int, default=300, help="requests in one copy of the replayed trace")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    probes = [p for path in sorted(args.trials.glob("*/requests.csv")) for p in paired_probes(path, args.period)]
    print("trial        probe  offered  e2e trend  output early/late  pairs  paired median  p75   p90")
    for p in probes:
        print(f"{p.trial:<12} {p.probe:>5}  {p.offered_rps:7.2f}  {p.e2e_trend:9.2f}  {p.output_early:7.0f} / "
              f"{p.output_late:<7.0f}  {p.pairs:5d}  {p.paired_median:13.2f}  {p.paired_p75:4.2f}  {p.paired_p90:4.2f}")
    if args.json:
        args.json.write_text(json.dumps([asdict(p) for p in probes], indent=1) + "\n")


if __name__ == "__main__":
    main()
