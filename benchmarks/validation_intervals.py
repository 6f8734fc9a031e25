"""How wide a validated gain's interval is against the number of repeats, and how often identical configurations
are wrongly told apart, on real vLLM through the product's own commands.

A study on the README's main-job settings runs vLLM's default and one other configuration (`--set`), then
`tuner study validate --repeats R` (R = 5 by default: 2R launches, interleaved). From those launches:

- the gain's interval computed from the first 2, 3, ... R rounds, as a validation with that many repeats would
  have stated it (its ratio, ends and width);
- A/A splits: every way of splitting one arm's R launches into two disjoint groups of 2 (both arms), each judged
  as an A/A validation would be: how often its interval excludes 1 (a gain, or a loss, called between identical
  configurations);
- then, with `--aa-check`, one real A/A check, `tuner study validate --against-itself --repeats 2`, as a user
  runs it (four launches more).

    .venv/bin/python benchmarks/validation_intervals.py --repeats 5 --set max_num_seqs=8 \
        --json benchmarks/results/validation-intervals.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.validation import gain_interval  # noqa: E402

# The README's main job: its load search's precision is the interval's floor.
CREATE = ["--max-requests", "16", "--rate-scale", "2", "--fit", "clip", "--precision", "0.25"]
PRECISION = 0.25


def tuner(*args: str, env: dict[str, str]) -> str:
    """One `tuner` command as a user runs it; its stdout. A failure ends the benchmark with its stderr."""
    result = subprocess.run([sys.executable, "-m", "tuner", *args], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"tuner {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


def interval_row(values: list[float], reference: list[float]) -> dict:
    found = gain_interval(values, reference, PRECISION)
    return {"repeats": len(values), "ratio": found.ratio, "low": found.low, "high": found.high,
            "width": found.high / found.low, "includes_one": found.includes_one}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--set", dest="setting", default="max_num_seqs=8", help="the other configuration")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--aa-check", action="store_true", help="end with a real A/A check (four launches more)")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "TUNER_HOME": home}
        env.pop("TUNER_STORAGE", None)
        env.pop("TUNER_ARTIFACTS", None)
        tuner("study", "create", "bench", *CREATE, env=env)
        tuner("study", "enqueue", "bench", "--set", args.setting, env=env)
        tuner("study", "run", "bench", "--trials", "2", "--no-validate", env=env)
        validated = json.loads(tuner("study", "validate", "bench", "--repeats", str(args.repeats), "--json", env=env))
        best = json.loads(tuner("study", "best", "bench", "--json", env=env))["validation"]
        aa = (json.loads(tuner("study", "validate", "bench", "--against-itself", "--json", env=env))
              if args.aa_check else None)
        exported = json.loads(tuner("study", "export", "bench", env=env))
    wall_s = time.monotonic() - started
    default, other = (arm["values"] for arm in best["arms"])
    widths = [interval_row(other[:r], default[:r]) for r in range(2, args.repeats + 1)]
    splits = []
    for arm in (default, other):
        for a in itertools.combinations(range(len(arm)), 2):
            rest = [i for i in range(len(arm)) if i not in a]
            for b in itertools.combinations(rest, 2):
                if a < b:  # each split once
                    splits.append(interval_row([arm[i] for i in a], [arm[i] for i in b]))
    wrong = sum(not s["includes_one"] for s in splits)
    startup = [t["timings"]["startup_s"] for t in exported["trials"] if t["timings"]]
    results = {
        "setting": args.setting, "repeats": args.repeats, "precision": PRECISION, "wall_s": wall_s,
        "launches": len(exported["trials"]), "startup_s": startup,
        "default_capacities": default, "other_capacities": other,
        "validation_sentence": validated["validation"], "widths_by_repeats": widths,
        "aa_splits": len(splits), "aa_splits_excluding_one": wrong, "aa_split_widths": [s["width"] for s in splits],
        "aa_check_sentence": aa["validation"] if aa else None,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(exported['trials'])} launches in {wall_s / 60:.1f} min")
    print(f"vLLM's default, capacity req/s: {', '.join(f'{v:.3g}' for v in default)}")
    print(f"{args.setting}: {', '.join(f'{v:.3g}' for v in other)}")
    print("repeats  ratio  95% CI        high/low")
    for w in widths:
        print(f"{w['repeats']:>7}  {w['ratio']:.2f}   {w['low']:.2f}-{w['high']:.2f}    {w['width']:.2f}")
    print(f"A/A splits (2 against 2 launches of one configuration): {wrong} of {len(splits)} exclude 1")
    print(f"validation: {validated['validation']}")
    if aa:
        print(f"A/A check: {aa['validation']}")


if __name__ == "__main__":
    main()
