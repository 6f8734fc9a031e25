"""Trials per hour with 1 and 2 Ray slots on the same study, and the scheduling overhead per trial (from a
slot freeing to the launch of the next trial's engine on that slot).

Each run is a fresh study with the same N enqueued configurations (so both runs do the same work), the
tiny model on the CPU build of vLLM.

    .venv/bin/python benchmarks/parallel_efficiency.py --model DIR [--trials 4] [--json FILE]
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

from tuner.study.create import create_study, enqueue_config  # noqa: E402
from tuner.study.events import WorkerDone  # noqa: E402
from tuner.study.plan import StoragePlan  # noqa: E402
from tuner.study.runner import StudyRunner  # noqa: E402
from tuner.traces.selection import TraceSelection  # noqa: E402
from tuner.workers.engine_config import EngineConfig  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_conv_2023.csv"
CONFIG = EngineConfig(max_num_seqs=8, num_gpu_blocks_override=64, max_num_batched_tokens=1024)


def run(model: Path, slots: int, trials: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        plan = StoragePlan.resolve(f"sqlite:///{tmp}/tuner.db", Path(tmp) / "artifacts")
        create_study("bench", model=model, trace_path=TRACE, space="cpu-small", boundary_name="batch", limits={},
                     plan=plan, selection=TraceSelection(max_requests=16, rate_scale=4.0, fit="clip"))
        for _ in range(trials - 1):  # trial 0 is the baseline
            enqueue_config("bench", plan, CONFIG)
        events: list[tuple[str, dict]] = []
        runner = StudyRunner("bench", plan, parallel=slots, on_event=events.append)
        started = time.monotonic()
        report = runner.run(trials)
        wall = time.monotonic() - started
        overheads = [e.scheduling_s for e in events if isinstance(e, WorkerDone) and e.scheduling_s is not None]
        totals = [t.timings.total_s for t in runner.opened.repo.trials("bench")]
    return {"slots": slots, "trials": len(report.trials), "states": [t.state for t in report.trials],
            "wall_s": wall, "trials_per_hour": 3600 * len(report.trials) / wall,
            "trial_s_median": statistics.median(totals),
            "scheduling_overhead_s": overheads,
            "overhead_share": (statistics.median(overheads) / statistics.median(totals)) if overheads else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [run(args.model, slots, args.trials) for slots in (1, 2)]
    for r in rows:
        print(f"{r['slots']} slot(s): {r['trials']} trials in {r['wall_s']:.1f} s = {r['trials_per_hour']:.0f} "
              f"trials/hour; median trial {r['trial_s_median']:.1f} s; scheduling overhead "
              f"{[round(x, 3) for x in r['scheduling_overhead_s']]} s "
              f"({(r['overhead_share'] or 0):.2%} of a trial)")
    efficiency = rows[1]["trials_per_hour"] / (2 * rows[0]["trials_per_hour"])
    print(f"parallel efficiency with 2 slots: {efficiency:.1%}")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "parallel_efficiency": efficiency}, indent=2) + "\n")


if __name__ == "__main__":
    main()
