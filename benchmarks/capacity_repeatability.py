"""Repeatability and cost of the load search on real vLLM: one configuration's capacity measured in several
separate launches, and the same configuration at a fixed load, interleaved (search, fixed, search, fixed, ...)
so that drift of the machine hits both alike.

Reports the capacity's coefficient of variation over the launches (the issue's target: <= 5%) and the trial time
of a search against a fixed-load trial, as the ratio of their medians with the spread of each.

    .venv/bin/python benchmarks/capacity_repeatability.py --launches 5 \
        --json benchmarks/results/capacity-repeatability.json

With `--precision 0.10:6 0.05:8` it compares searches of two precisions (each with its probe budget), launch by
launch in turn, instead of a search against a fixed load (`--no-fixed` leaves the fixed-load launches out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.analysis.capacity import JudgedProbe, LoadPolicy, capacity_of  # noqa: E402
from tuner.common.models import default_model  # noqa: E402
from tuner.common.paths import bundled_trace  # noqa: E402
from tuner.analysis.scoring import boundary  # noqa: E402
from tuner.traces.selection import TraceSelection, load_trace  # noqa: E402
from tuner.workers.engine_config import EngineConfig  # noqa: E402
from tuner.workers.trial import TrialSpec, run_trial  # noqa: E402

# The README's main job: the bundled trace's first 16 requests at twice their rate, the cpu-small space's fixed
# settings and vLLM's defaults for the rest (the study's baseline).
SELECTION = TraceSelection(max_requests=16, rate_scale=2.0, fit="clip")
CONFIG = EngineConfig(enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=268435456,
                      enable_chunked_prefill=True)


def one_trial(model: Path, policy: LoadPolicy) -> dict:
    """One launch of CONFIG under `policy`: its wall time, probes and (searched) capacity."""
    bound = boundary("interactive")
    trace = load_trace(bundled_trace(), SELECTION, CONFIG.max_model_len)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        outcome = run_trial(TrialSpec(model, trace, CONFIG, Path(tmp), load=policy.plan(bound, below_reference=True)))
        wall_s = time.monotonic() - started
    judged = [JudgedProbe.of(run, bound) for run in outcome.probes]
    capacity = capacity_of(judged, policy, SELECTION.rate_scale or 1.0) if policy.mode == "search" else None
    return {"mode": policy.mode, "wall_s": wall_s, "startup_s": outcome.record.timings.startup_s,
            "probes": [{"offered_rps": j.probe.offered_rps, "verdict": j.verdict.value} for j in judged],
            "capacity_rps": capacity.rps if capacity else None, "ended": capacity.ended if capacity else None}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "cv": statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0}


def search_policy(text: str) -> LoadPolicy:
    """`0.05:8`: a load search of that precision and probe budget."""
    precision, _, budget = text.partition(":")
    return LoadPolicy(precision=float(precision), probe_budget=int(budget or LoadPolicy.probe_budget))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--precision", type=search_policy, nargs="+", default=[LoadPolicy()],
                        help="searches to compare, each PRECISION[:PROBE_BUDGET] (default: 0.1:6)")
    parser.add_argument("--no-fixed", action="store_true", help="no fixed-load launches")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = default_model()
    policies = [*args.precision, *([] if args.no_fixed else [LoadPolicy.fixed()])]
    runs = []
    for i in range(args.launches):
        for policy in policies:
            run = {**one_trial(model, policy), "precision": policy.precision, "probe_budget": policy.probe_budget}
            runs.append(run)
            print(f"launch {i + 1} {run['mode']} ({policy.precision:g}:{policy.probe_budget}): {run['wall_s']:.1f} s, "
                  f"capacity {run['capacity_rps']}, {run['ended']}", flush=True)
    fixed = [r for r in runs if r["mode"] == "fixed"]
    summary: dict = {}
    for policy in args.precision:
        searched = [r for r in runs if r["mode"] == "search" and r["precision"] == policy.precision]
        capacities = [r["capacity_rps"] for r in searched if r["capacity_rps"] is not None]
        key = "" if len(args.precision) == 1 else f"precision {policy.precision:g}: "
        summary[f"{key}capacity_rps"] = spread(capacities) if capacities else None
        summary[f"{key}search_wall_s"] = spread([r["wall_s"] for r in searched])
        summary[f"{key}probes"] = spread([len(r["probes"]) for r in searched])
        if fixed:
            summary[f"{key}cost_ratio"] = (statistics.median(r["wall_s"] for r in searched)
                                           / statistics.median(r["wall_s"] for r in fixed))
    if fixed:
        summary["fixed_wall_s"] = spread([r["wall_s"] for r in fixed])
    summary["runs"] = runs
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
