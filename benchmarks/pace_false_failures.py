"""How often the pace rule ("did not keep up") fails a steady engine, one whose latencies do not grow with
time, on the README main job's probe: the bundled trace's first 16 requests at twice their rate, repeated to 80
requests as a probe is (tuner.workers.probes.probe_trace). No vLLM: each request's end-to-end latency is drawn
as (base + seconds per output token x its output tokens) x lognormal noise, and, with --stall, the machine
pauses once for that long at a random moment, delaying every request in flight or due during the pause (what a
busy machine does to an engine that keeps up). A rate above a few percent is a rule that fails engines for the
machine's noise. Two rules: the shortfall of late requests alone (the rule before 2026-12-04), and
tuner.analysis.scoring.pace_violations as it stands; and the power of each, how often it fails an engine overloaded by a
factor (a queue that grows, in a fluid model: a request due at t waits (factor - 1) x t more).

    .venv/bin/python benchmarks/pace_false_failures.py --draws 500
    .venv/bin/python benchmarks/pace_false_failures.py --gpu-study --draws 200
    .venv/bin/python benchmarks/pace_false_failures.py --carried --draws 200 --json out.json

With --gpu-study, the probes of issue 18's H100 study instead: the bundled trace's first 300 requests at 3.5
times their rate, each probe repeated to 600 requests and 8 s. Their late requests ask for twice the output
tokens of the early ones, which the rule's trend reads as growth.

With --carried, on both probes: the trend rule (before 2026-12-06: "grew" read as the last third's median latency
over the first third's) against the rule as it stands, which reads "grew" from the requests served in each span one
copy of the trace long (tuner.workers.measure.Pace.carried_share), and against that reading alone, without the
rule's gate of many late requests.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.common.paths import bundled_trace  # noqa: E402
from tuner.analysis.scoring import (STEADY_CARRIED, STEADY_SHORTFALL_MIN, STEADY_SHORTFALL_SHARE,  # noqa: E402
                                    pace_violations)
from tuner.traces.selection import TraceSelection, load_trace  # noqa: E402
from tuner.workers.measure import Pace  # noqa: E402
from tuner.workers.probes import probe_trace  # noqa: E402
from tuner.workers.request_record import Outcome, RequestRecord  # noqa: E402


def draw(trace, period: int, per_token_s: float, noise: float, stall_s: float, rng: random.Random,
         overload: float = 1.0) -> Pace:
    """One probe's pace (`period`: the requests of one copy of the trace it repeats): a steady engine (overload 1),
    or one whose queue grows."""
    return Pace.of(draw_records(trace, per_token_s, noise, stall_s, rng, overload), period)


def draw_records(trace, per_token_s: float, noise: float, stall_s: float, rng: random.Random,
                 overload: float = 1.0) -> list[RequestRecord]:
    """One probe's requests as `draw` models them."""
    stall_at = rng.uniform(0, trace.span_s) if stall_s else None
    records = []
    for i, req in enumerate(trace.requests):
        latency = (0.05 + per_token_s * req.output_tokens) * rng.lognormvariate(0, noise)
        latency += (overload - 1) * req.arrival_s
        if stall_at is not None and req.arrival_s <= stall_at + stall_s and req.arrival_s + latency >= stall_at:
            latency += stall_at + stall_s - max(req.arrival_s, stall_at)
        records.append(RequestRecord(i, req.arrival_s, req.arrival_s, req.output_tokens, req.input_tokens,
                                     req.output_tokens, Outcome.OK, ttft_s=0.05, e2e_s=latency))
    return records


def fails_by_shortfall_alone(pace: Pace) -> bool:
    """The rule before 2026-12-04: the shortfall alone, whether or not the latency grew (its drain part needs a
    pause longer than the probe)."""
    return pace.steady_shortfall > max(STEADY_SHORTFALL_MIN, STEADY_SHORTFALL_SHARE * pace.steady_arrivals)


def carried_alone(records: list[RequestRecord], period: int) -> bool:
    """A variant of the rule: a probe that repeats its trace fails on its carried share alone, without the gate of
    many late requests (the trend rule otherwise)."""
    pace = Pace.of(records, period)
    if pace.carried_share is None:
        return bool(pace_violations(pace))
    return pace.carried_share < STEADY_CARRIED


def carried_against_trend(draws: int, seed: int) -> list[dict]:
    """How often the trend rule, the rule as it stands and the carried share alone fail a steady engine and an
    overloaded one, on the README main job's probe and on the H100 study's."""
    shapes = {
        "main job: 16 requests x5": (TraceSelection(max_requests=16, rate_scale=2.0, fit="clip"), 1024, 1.0, 80),
        "H100 study at 1.41x: 300 requests x2": (TraceSelection(max_requests=300, rate_scale=3.5), 131072, 1.41,
                                                 600),
    }
    rows = []
    for shape, (selection, context, factor, requests) in shapes.items():
        base = load_trace(bundled_trace(), selection, context)
        trace = probe_trace(base, factor, requests, 8.0)
        period = len(base.requests)
        for overload in (1.0, 1.1, 1.25):
            for per_token_s in (0.005, 0.02):
                for noise in (0.1, 0.3):
                    for stall_s in ((0.0, 2.0, 5.0) if overload == 1.0 else (0.0,)):
                        rng = random.Random(seed)
                        drawn = [draw_records(trace, per_token_s, noise, stall_s, rng, overload)
                                 for _ in range(draws)]
                        rows.append({
                            "shape": shape, "overload": overload, "per_token_s": per_token_s, "noise": noise,
                            "stall_s": stall_s,
                            "fails_trend": sum(bool(pace_violations(Pace.of(r))) for r in drawn) / draws,
                            "fails_now": sum(bool(pace_violations(Pace.of(r, period))) for r in drawn) / draws,
                            "fails_carried_alone": sum(carried_alone(r, period) for r in drawn) / draws,
                            "carried_median": statistics.median(
                                c for r in drawn if (c := Pace.of(r, period).carried_share) is not None)})
    print("| probe | overload | s per output token | noise | one pause, s | trend rule | rule now | carried alone "
          "| median carried share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['overload']:g} | {r['per_token_s']} | {r['noise']} | {r['stall_s']:g} "
              f"| {r['fails_trend']:.0%} | {r['fails_now']:.0%} | {r['fails_carried_alone']:.0%} "
              f"| {r['carried_median']:.2f} |")
    return rows


def gpu_study(draws: int, seed: int) -> None:
    """How often the rule fails a steady engine (noise 0.1) on the H100 study's probes, by load and by seconds per
    output token (the H100 decoded at 17-22 ms a token in its probes above the reference load)."""
    base = load_trace(bundled_trace(), TraceSelection(max_requests=300, rate_scale=3.5), 131072)
    print("| load (x reference) | requests | s per output token | median latency, last third / first | steady engine "
          "failed: trend rule | rule now |")
    print("|---|---|---|---|---|---|")
    for factor in (1.0, 1.19, 1.41, 1.68):
        trace = probe_trace(base, factor, 600, 8.0)
        for per_token_s in (0.01, 0.02):
            rng = random.Random(seed)
            paces = [draw(trace, len(base.requests), per_token_s, 0.1, 0.0, rng) for _ in range(draws)]
            trend = statistics.median(p.e2e_trend for p in paces if p.e2e_trend is not None)
            by_trend = sum(bool(pace_violations(replace(p, carried_share=None))) for p in paces) / draws
            failed = sum(bool(pace_violations(p)) for p in paces) / draws
            print(f"| {factor:g} | {len(trace.requests)} | {per_token_s} | x{trend:.2f} | {by_trend:.0%} "
                  f"| {failed:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--gpu-study", action="store_true", help="the probes of issue 18's H100 study")
    parser.add_argument("--carried", action="store_true", help="the trend rule against the rule as it stands, which "
                                                               "reads growth from the requests served per copy")
    args = parser.parse_args()
    if args.gpu_study:
        return gpu_study(args.draws, args.seed)
    if args.carried:
        rows = carried_against_trend(args.draws, args.seed)
        if args.json:
            args.json.write_text(json.dumps({"draws": args.draws, "seed": args.seed, "rows": rows}, indent=2) + "\n")
        return None
    base = load_trace(bundled_trace(), TraceSelection(max_requests=16, rate_scale=2.0, fit="clip"), 1024)
    trace = probe_trace(base, 1.0, 80, base.span_s)

    def rates(per_token_s: float, noise: float, stall_s: float, overload: float) -> tuple[float, float]:
        rng = random.Random(args.seed)
        paces = [draw(trace, len(base.requests), per_token_s, noise, stall_s, rng, overload)
                 for _ in range(args.draws)]
        return (sum(map(fails_by_shortfall_alone, paces)) / args.draws,
                sum(bool(pace_violations(p)) for p in paces) / args.draws)

    rows = []
    for overload in (1.0, 1.1, 1.25, 1.5):
        for per_token_s in (0.005, 0.01, 0.02):
            for noise in (0.0, 0.1, 0.3):
                for stall_s in ((0.0, 2.0, 5.0) if overload == 1.0 else (0.0,)):
                    alone, now = rates(per_token_s, noise, stall_s, overload)
                    rows.append({"overload": overload, "per_token_s": per_token_s, "noise": noise,
                                 "stall_s": stall_s, "fails_shortfall_alone": alone, "fails_now": now})
    print(f"probe: {len(trace.requests)} requests over {trace.span_s:.1f} s; {args.draws} draws a row")
    print("| overload | s per output token | noise (lognormal sigma) | one pause, s | shortfall alone | rule now |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['overload']:g} | {r['per_token_s']} | {r['noise']} | {r['stall_s']:g} "
              f"| {r['fails_shortfall_alone']:.1%} | {r['fails_now']:.1%} |")
    if args.json:
        args.json.write_text(json.dumps({"draws": args.draws, "seed": args.seed, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
