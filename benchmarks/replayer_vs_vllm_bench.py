"""Our replayer against vLLM's own benchmark client (`vllm.benchmarks.serve`), on one real server, one workload.

Both send the same schedule: N requests at a constant rate (vLLM's `--burstiness inf`), 256 random prompt
tokens, 64 output tokens with ignore_eos, streaming `/v1/completions`. Rounds alternate (ours, theirs, ours,
theirs, ...) on the same server so drift hits both. Then one whole `run_trial` on the same workload gives the
per-trial overhead: trial wall time minus vLLM startup minus the trace's replay span.

    .venv/bin/python benchmarks/replayer_vs_vllm_bench.py --model DIR [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.traces.stats import percentile  # noqa: E402
from tuner.traces.records import Trace, TraceRequest  # noqa: E402
from tuner.workers.engine_config import EngineConfig  # noqa: E402
from tuner.workers.launch import SERVED_MODEL_NAME, launch_engine  # noqa: E402
from tuner.workers.replay import prepare_requests, replay  # noqa: E402
from tuner.workers.request_record import Outcome  # noqa: E402
from tuner.workers.trial import TrialSpec, run_trial  # noqa: E402

CONFIG = EngineConfig(max_num_seqs=16, max_model_len=1024, enforce_eager=True, kv_cache_memory_bytes=268435456)
INPUT, OUTPUT = 256, 64

VLLM_BENCH = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
print("RESULT " + json.dumps({k: result[k] for k in ("median_ttft_ms", "median_e2el_ms", "completed")}))
"""


def constant_rate_trace(n: int, rate: float) -> Trace:
    return Trace(f"constant-{rate:g}", "native", "-", tuple(TraceRequest(i / rate, INPUT, OUTPUT) for i in range(n)))


def ours(base_url: str, trace: Trace, vocab: int) -> dict:
    result = asyncio.run(replay(base_url, prepare_requests(trace, vocab, SERVED_MODEL_NAME, seed=int(time.time())),
                                collect_metrics=False))
    ok = [r for r in result.records if r.outcome is Outcome.OK]
    return {"median_ttft_ms": 1000 * percentile([r.ttft_s for r in ok], 50),
            "median_e2el_ms": 1000 * percentile([r.e2e_s for r in ok], 50), "completed": len(ok)}


def theirs(base_url: str, model: Path, n: int, rate: float) -> dict:
    argv = [sys.executable, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", base_url,
            "--endpoint", "/v1/completions", "--model", SERVED_MODEL_NAME, "--tokenizer", str(model),
            "--dataset-name", "random", "--random-input-len", str(INPUT), "--random-output-len", str(OUTPUT),
            "--random-range-ratio", "0", "--num-prompts", str(n), "--request-rate", str(rate),
            "--burstiness", "inf", "--ignore-eos", "--disable-tqdm", "--percentile-metrics", "ttft,e2el",
            "--seed", str(int(time.time()))]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"vllm.benchmarks.serve failed:\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from tuner.common.models import inspect_model

    vocab = inspect_model(args.model).vocab_size
    trace = constant_rate_trace(args.requests, args.rate)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, launch_engine(args.model, CONFIG, Path(tmp) / "server.log") as engine:
        ours(engine.base_url, constant_rate_trace(8, args.rate), vocab)  # warm-up, not counted
        for i in range(args.rounds):
            for client, run in (("tuner", lambda: ours(engine.base_url, trace, vocab)),
                                ("vllm.benchmarks.serve", lambda: theirs(engine.base_url, args.model,
                                                                         args.requests, args.rate))):
                row = {"round": i + 1, "client": client, **run()}
                rows.append(row)
                print(f"round {row['round']} {client:<22} TTFT median {row['median_ttft_ms']:7.2f} ms, "
                      f"e2e median {row['median_e2el_ms']:8.2f} ms, completed {row['completed']}", flush=True)
    summary = {}
    for metric in ("median_ttft_ms", "median_e2el_ms"):
        mine = statistics.median(r[metric] for r in rows if r["client"] == "tuner")
        ref = statistics.median(r[metric] for r in rows if r["client"] != "tuner")
        summary[metric] = {"tuner": mine, "vllm_bench": ref, "ratio": mine / ref}
        print(f"{metric}: tuner {mine:.2f} ms / vllm bench {ref:.2f} ms = {mine / ref:.3f}")

    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        outcome = run_trial(TrialSpec(args.model, trace, CONFIG, Path(tmp)))
        wall = time.monotonic() - started
    t = outcome.record.timings
    overhead = wall - t.startup_s - trace.span_s
    summary["per_trial"] = {"wall_s": wall, "startup_s": t.startup_s, "replay_span_s": trace.span_s,
                            "replay_s": t.replay_s, "teardown_s": t.teardown_s, "overhead_s": overhead,
                            "overhead_share": overhead / wall}
    print(f"per-trial: wall {wall:.1f} s, startup {t.startup_s:.1f} s, trace span {trace.span_s:.1f} s, "
          f"replay {t.replay_s:.1f} s, teardown {t.teardown_s:.1f} s -> overhead {overhead:.1f} s "
          f"({overhead / wall:.1%} of the trial)")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rows, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
