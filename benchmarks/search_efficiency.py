"""Search efficiency on real vLLM: a full grid measured once, then the tuner's sampler and random search with
a third of the grid's trials, several seeds each, choosing among those measured configurations.

Phase 1 (real, minutes): every configuration of a 12-point grid (max_num_seqs x KV blocks x
max_num_batched_tokens) is launched and, by default, searched for its capacity (`--load search`: the load
probes of a study's trial, in full; `--load fixed`: one replay of the trace slice), without pruning; the records
are kept in --grid FILE (reused if it exists; a grid recorded before load searches is a fixed-load one). Phase 2
(seconds): for each seed, an Optuna study over exactly those grid values asks for configurations, each answered
with its real measurement, scored under the boundary as a study scores it; the best feasible capacity (at a
fixed load, completed throughput) reached by the study's recommendation rule is compared with the grid's best.
Also: the trial time the pruning rule saves, applying tuner.search.pruning.BoundaryWatch to each grid configuration's
recorded request timeline (the first probe's) as the live replay would have seen it.

    .venv/bin/python benchmarks/search_efficiency.py --model DIR --grid benchmarks/results/grid-64req-2x.json \
        [--max-requests 64 --rate-scale 2] [--load search|fixed --probe-requests 80] [--seeds 20] \
        [--limit e2e_p95_s=4] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.search.pruning import BoundaryWatch  # noqa: E402
from tuner.search.bottleneck import measurement_attrs  # noqa: E402
from tuner.analysis.capacity import JudgedProbe, LoadPolicy, capacity_of  # noqa: E402
from tuner.analysis.scoring import DIRECTIONS, Capacity, boundary, parse_limits, score  # noqa: E402
from tuner.search.samplers import make_sampler  # noqa: E402
from tuner.study.recommendation import THROUGHPUT_TIE  # noqa: E402
from tuner.traces.selection import TraceSelection, load_trace  # noqa: E402
from tuner.workers.engine_config import EngineConfig  # noqa: E402
from tuner.workers.measure import Measurement  # noqa: E402
from tuner.workers.replay import LiveReplay  # noqa: E402
from tuner.workers.request_record import Outcome, RequestRecord  # noqa: E402
from tuner.workers.trial import TrialSpec, run_trial  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_conv_2023.csv"
FIXED = dict(enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=268435456)
GRID = {"max_num_seqs": [2, 8, 16], "num_gpu_blocks_override": [16, 48], "max_num_batched_tokens": [256, 1024]}
optuna.logging.set_verbosity(optuna.logging.WARNING)


def key(params: dict) -> str:
    return json.dumps({k: params[k] for k in GRID}, sort_keys=True)


def measure_grid(model: Path, selection: TraceSelection, policy: LoadPolicy, bound) -> dict:
    """Every grid configuration launched once: at a fixed load, or with the load search (its full search: below
    a failing reference too, and no best-so-far shortcut, so that every point has its own capacity)."""
    trace = load_trace(TRACE, selection, FIXED["max_model_len"])
    points = {}
    for values in itertools.product(*GRID.values()):
        params = dict(zip(GRID, values))
        with tempfile.TemporaryDirectory() as tmp:
            outcome = run_trial(TrialSpec(model, trace, EngineConfig(**FIXED, **params), Path(tmp),
                                          load=policy.plan(bound, below_reference=True)))
        record = outcome.record
        judged = [JudgedProbe.of(run, bound) for run in outcome.probes]
        capacity = capacity_of(judged, policy, selection.rate_scale or 1.0) if policy.mode == "search" else None
        points[key(params)] = {"params": params, "timings": asdict(record.timings),
                               "measurement": record.measurement.to_dict() if record.measurement else None,
                               "failure": record.failure.kind.value if record.failure else None,
                               "requests": [r.to_dict() for r in outcome.requests],
                               "capacity": capacity.to_dict() if capacity else None,
                               "probes": [j.to_dict() for j in judged] if capacity else []}
        m = record.measurement
        print(f"measured {params}: {m.completed}/{m.requests} ok, {m.completed_rps:.3f} req/s, "
              f"p95 e2e {m.e2e_s.p95:.2f} s, preemptions {m.preemptions}, "
              f"capacity {capacity.rps if capacity else '-'}, trial {record.timings.total_s:.1f} s", flush=True)
    return {"trace_span_s": trace.span_s, "selection": {"max_requests": selection.max_requests,
                                                         "rate_scale": selection.rate_scale},
            "load": policy.to_dict(), "points": points}


def _measurement(data: dict) -> Measurement:
    return Measurement.from_dict(data)


def scores(grid: dict, bound) -> dict[str, object]:
    """Each point scored as a study scores it: by its capacity after a load search (the engine must keep up at the
    reference load then), else by its one replay."""
    scored = {}
    for k, p in grid["points"].items():
        capacity = Capacity.from_dict(p["capacity"]) if p.get("capacity") else None
        scored[k] = score(_measurement(p["measurement"]), bound, grid["trace_span_s"], capacity,
                          judge_pace=capacity is not None)
    return scored


def recommended_rps(scored: list, tie: float) -> float:
    """The study's rule: the highest first objective (capacity, or completed throughput at a fixed load) among
    the feasible, near-ties (within `tie`) to the lower p95."""
    feasible = [s for s in scored if s.feasible]
    if not feasible:
        return 0.0
    top = max(s.objectives[0] for s in feasible)
    contenders = [s for s in feasible if s.objectives[0] >= top * (1 - tie)]
    return min(contenders, key=lambda s: (s.e2e_p95_s, -s.objectives[0])).objectives[0]


def search(grid: dict, scored: dict, sampler: str, seed: int, budget: int, tie: float) -> list[float]:
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=make_sampler(sampler, seed))
    seen, curve = [], []
    for _ in range(budget):
        trial = study.ask()
        params = {name: trial.suggest_categorical(name, values) for name, values in GRID.items()}
        s = scored[key(params)]
        # The figures a study's trial leaves for the sampler (tuner.search.bottleneck reads them).
        for name, value in measurement_attrs(_measurement(grid["points"][key(params)]["measurement"])).items():
            trial.set_user_attr(name, value)
        for name, value in s.constraints.items():
            trial.set_constraint(name, value)
        study.tell(trial, list(s.objectives))
        seen.append(s)
        curve.append(recommended_rps(seen, tie))
    return curve


def pruning_savings(grid: dict, bound) -> dict:
    """When the live rule would have stopped each configuration, from its recorded request timeline."""
    total_trial_s = saved_s = 0.0
    stopped = []
    for point in grid["points"].values():
        records = [RequestRecord(**{**r, "outcome": Outcome(r["outcome"])}) for r in point["requests"]]
        watch = BoundaryWatch(bound)
        replay_s = point["timings"]["replay_s"]
        total_trial_s += point["timings"]["startup_s"] + replay_s + point["timings"]["teardown_s"]
        t = 0.25
        while t < replay_s:
            reason = watch(replace(LiveReplay.as_of(records, t, replay_s), span_s=grid["trace_span_s"]))
            if reason:
                saved_s += replay_s - t
                stopped.append({"config": point["params"], "at_s": t, "replay_s": replay_s, "reason": reason})
                break
            t += 0.25
    return {"stopped": stopped, "saved_s": saved_s, "grid_trial_s": total_trial_s,
            "saved_share": saved_s / total_trial_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--grid", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--max-requests", type=int, default=64, help="trace slice of a new grid")
    parser.add_argument("--rate-scale", type=float, default=2.0, help="trace slice of a new grid")
    parser.add_argument("--limit", action="append", default=[])
    parser.add_argument("--samplers", default="bottleneck,tpe,random")
    parser.add_argument("--load", choices=("search", "fixed"), default="search",
                        help="measure each point's capacity (the load search) or one replay at the reference load")
    parser.add_argument("--probe-requests", type=int, default=80)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    bound = boundary("interactive", parse_limits(args.limit))
    if not args.grid.exists():
        selection = TraceSelection(max_requests=args.max_requests, rate_scale=args.rate_scale, fit="clip")
        policy = LoadPolicy(probe_requests=args.probe_requests) if args.load == "search" else LoadPolicy.fixed()
        args.grid.write_text(json.dumps(measure_grid(args.model, selection, policy, bound), indent=1) + "\n")
    grid = json.loads(args.grid.read_text())
    policy = LoadPolicy.from_dict(grid.get("load"))
    tie = policy.precision if policy.mode == "search" else THROUGHPUT_TIE
    scored = scores(grid, bound)
    best = recommended_rps(list(scored.values()), tie)
    feasible = sum(s.feasible for s in scored.values())
    budget = len(scored) // 3
    print(f"grid: {len(scored)} configurations, {feasible} feasible under {bound}; best {best:.3f} req/s; "
          f"budget {budget} trials")
    result = {"grid_best_rps": best, "feasible": feasible, "budget": budget, "boundary": bound.to_dict(),
              "samplers": {}}
    for sampler in args.samplers.split(","):
        curves = [search(grid, scored, sampler, seed, budget, tie) for seed in range(args.seeds)]
        fractions = [[c / best for c in curve] for curve in curves]
        medians = [statistics.median(f[i] for f in fractions) for i in range(budget)]
        final = [f[-1] for f in fractions]
        result["samplers"][sampler] = {"median_fraction_by_trial": medians, "final_fractions": final,
                                       "seeds_reaching_95pct": sum(f >= 0.95 for f in final),
                                       "seeds_reaching_optimum": sum(f >= 1.0 - 1e-9 for f in final)}
        print(f"{sampler:>10}: median fraction of the grid optimum after 1..{budget} trials: "
              + ", ".join(f"{m:.1%}" for m in medians) + f"; seeds reaching 95% {sum(f >= 0.95 for f in final)}"
              f"/{len(final)}, the optimum {sum(f >= 1.0 - 1e-9 for f in final)}/{len(final)}, worst {min(final):.1%}")
    result["pruning"] = pruning_savings(grid, bound)
    p = result["pruning"]
    print(f"pruning: {len(p['stopped'])} of {len(scored)} configurations stopped early, saving "
          f"{p['saved_s']:.1f} s of {p['grid_trial_s']:.1f} s of trial time ({p['saved_share']:.1%})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
