"""Where a validation launch spends its probes, and how wide a bracket it is left with: the load search as it is
(one precision step beside the capacity its configuration showed in the search, then doubling, then bisection)
with the study's probe budget and with twice it (what a validation launch now has), against an alternative tried
and not adopted: climbing 1, 2, 4 ... precision steps from that capacity instead of doubling.

Each launch is the product's own `LoadSearch` (the reference load first, then the start, then as the rule says),
answered by a model engine instead of real probes: a load passes when it lies at or below the engine's true
capacity, times a lognormal noise of `--noise` per probe (the edge of a real probe is not sharp). For each
true capacity (a multiple of the start) it records over `--draws` launches the bracket each ends with (how far
above its capacity the first failing load lay, edge / capacity - 1; open where none failed) and the probes
spent. Seconds on a CPU, no engine.

    .venv/bin/python benchmarks/validation_ladder.py --start 1.18 --budget 5 --precision 0.1 --draws 400 \
        --json benchmarks/results/validation-ladder.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.analysis.capacity import LoadPolicy, LoadSearch, bracket  # noqa: E402
from tuner.analysis.scoring import boundary  # noqa: E402

RATIOS = (0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 3.0)


class ClimbingLadder(LoadSearch):
    """The alternative: above a start and its step that both passed, twice as far from the start each time (1, 2,
    4 ... steps) while the loads pass."""

    def _from_start(self, results: list[tuple[float, bool]], lo: float | None, hi: float | None) -> float | None:
        start, top = self.start_factor, self.policy.max_factor
        if start is not None and hi is None and lo is not None and start < lo < top:
            return min(lo * lo / start, top)
        return super()._from_start(results, lo, hi)


def launch(search: LoadSearch, capacity: float, noise: float, rng: random.Random) -> tuple[float, int, float]:
    """One launch against a model engine: (its capacity found, the probes spent, its bracket; inf when open)."""
    results: list[tuple[float, bool]] = []
    factor: float | None = 1.0
    while factor is not None and len(results) < search.policy.probe_budget:
        results.append((factor, factor <= capacity * math.exp(rng.gauss(0.0, noise))))
        factor = search._next(results, None)
    lo, hi = bracket(results)
    if lo is None:
        return 0.0, len(results), 0.0
    return lo, len(results), math.inf if hi is None else hi / lo - 1


def summary(rows: list[tuple[float, int, float]], capacity: float, precision: float) -> dict:
    """The launches' brackets (median; None when over half are open), their open and within-precision shares,
    the probes spent and the capacity found against the true one."""
    widths = sorted(w for _, _, w in rows)
    median = widths[len(widths) // 2]
    return {"bracket_median": median if math.isfinite(median) else None,
            "open_share": sum(math.isinf(w) for w in widths) / len(widths),
            "within_precision_share": sum(w <= precision * (1 + 1e-9) for w in widths) / len(widths),
            "probes_mean": statistics.fmean(p for _, p, _ in rows),
            "found_over_true_median": statistics.median(lo / capacity for lo, _, _ in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", type=float, default=1.18,
                        help="the search's capacity, x the reference load (the H100 default's 14.8 of 12.5 req/s)")
    parser.add_argument("--budget", type=int, default=5, help="probes per launch, the reference's included")
    parser.add_argument("--precision", type=float, default=0.1)
    parser.add_argument("--noise", type=float, default=0.03, help="lognormal sigma of a probe's pass edge")
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    policy = LoadPolicy(precision=args.precision, probe_budget=args.budget)
    bound = boundary("interactive", {})
    ladders = {f"{'climbing' if kind is ClimbingLadder else 'doubling'}, {p.probe_budget} probes":
               kind(p, bound, below_reference=True, start_factor=args.start)
               for kind in (LoadSearch, ClimbingLadder) for p in (policy, policy.for_launch(validation=True))}
    out: dict = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "rows": []}
    print(f"start x{args.start:g} the reference, {args.budget} probes, precision {args.precision:.0%}, "
          f"noise {args.noise:g}, {args.draws} draws each")
    print("per ladder: the bracket's median, the shares open and within the precision, the probes spent")
    print("true/start | " + " | ".join(ladders))
    for ratio in RATIOS:
        capacity = ratio * args.start
        row: dict = {"true_over_start": ratio}
        cells = []
        for name, search in ladders.items():
            rng = random.Random(args.seed)
            rows = [launch(search, capacity, args.noise, rng) for _ in range(args.draws)]
            stats = summary(rows, capacity, args.precision)
            row[name] = stats
            median = stats["bracket_median"]
            cells.append(f"{'open' if median is None else f'{median:.0%}'}, {stats['open_share']:.0%}, "
                         f"{stats['within_precision_share']:.0%}, {stats['probes_mean']:.1f}")
        out["rows"].append(row)
        print(f"{ratio:>10g} | " + " | ".join(cells))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
