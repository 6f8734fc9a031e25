"""Replayer fidelity: how late requests leave against their schedule, at 50, 200 and 500 req/s.

The minimal streaming server runs on one core and the replayer on the other, so the client's own lateness is
what is measured. Poisson arrivals (seeded), 16 output tokens streamed 5 ms apart, 64 prompt tokens. As in a
real trial, /metrics is sampled every 0.25 s and the server watched on the same event loop. Lateness is the
send time the replayer records (the request's task starting, just before httpx takes a pooled connection and
writes it) minus the time it was due.

    .venv/bin/python benchmarks/replay_fidelity.py [--seconds 10] [--json FILE]

With `--loops asyncio uvloop --repeats 3`, each rate and mode runs on each event loop in turn, repeated: the
standard library's loop against uvloop's, side by side, so that drift of the machine hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.traces.stats import percentile  # noqa: E402
from tuner.traces.records import Trace, TraceRequest  # noqa: E402
from tuner.workers.launch import free_port  # noqa: E402
from tuner.workers.replay import ReplayResult, prepare_requests, replay  # noqa: E402
from tuner.workers.request_record import Outcome  # noqa: E402


OUTPUT_TOKENS = 16


def poisson_trace(rate: float, seconds: float, seed: int) -> Trace:
    rng = random.Random(seed)
    t, requests = 0.0, []
    while t < seconds:
        requests.append(TraceRequest(t, 64, OUTPUT_TOKENS))
        t += rng.expovariate(rate)
    return Trace(f"poisson-{rate:g}", "native", "-", tuple(requests))


def start_server(core: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("minimal_server.py")), "--port", str(port),
                             "--gap-ms", "5"], preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("minimal server did not start")


# How a replay's coroutine is run: the standard library's event loop, or uvloop's.
LOOPS: dict[str, Callable[[Coroutine[Any, Any, ReplayResult]], ReplayResult]] = {
    "asyncio": asyncio.run, "uvloop": uvloop.run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--loops", nargs="+", choices=sorted(LOOPS), default=["asyncio"],
                        help="event loops to replay on, in turn")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every loop at every rate and mode")
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    proc, url = start_server(core=1)
    rows = []
    try:
        for rate in (50, 200, 500):
            trace = poisson_trace(rate, args.seconds, seed=rate)
            # As in a real trial (/metrics sampled every 0.25 s and the server watched, on the same event loop),
            # then the requests alone, back to back: the sampler's share of the lateness.
            for repeat, mode, loop in itertools.product(range(args.repeats), ("as in a trial", "requests only"),
                                                        args.loops):
                in_trial = mode == "as in a trial"
                result = LOOPS[loop](replay(url, prepare_requests(trace, 1024, "model"), collect_metrics=in_trial,
                                            engine_alive=(lambda: proc.poll() is None) if in_trial else None))
                late_ms = [r.lateness_s * 1000 for r in result.records if r.lateness_s is not None]
                ok = sum(r.outcome is Outcome.OK for r in result.records)
                rows.append({"rate_rps": rate, "mode": mode, "loop": loop, "repeat": repeat,
                             "requests": len(result.records), "ok": ok, "metrics_samples": len(result.timeline),
                             "lateness_p50_ms": percentile(late_ms, 50), "lateness_p99_ms": percentile(late_ms, 99),
                             "lateness_max_ms": max(late_ms), "achieved_rps": len(result.records) / trace.span_s})
                print(f"{rate:>4} req/s, {mode}, {loop}: {len(result.records)} requests, {ok} ok, lateness p50 "
                      f"{rows[-1]['lateness_p50_ms']:.3f} ms, p99 {rows[-1]['lateness_p99_ms']:.3f} ms, "
                      f"max {rows[-1]['lateness_max_ms']:.3f} ms", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
