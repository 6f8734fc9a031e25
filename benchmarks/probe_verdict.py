"""How much replay time the verdict watch saves on stored probes, and that it changes no verdict.

Every probe of every trial stored under benchmarks/results/h100-llama8b-prod-* (the trials of resume-state.tar.gz and
trials.tar.gz, read in memory, and a trials/ folder where there is one; a trial stored by several runs of a study
counted once): its requests (requests.csv, by the `probe` column) and the probe as measured (measurement.json).
The watch (tuner.search.pruning.VerdictWatch, under the study's boundary) is polled over the recorded requests as a
replay polls it, every 0.25 s from the probe's start, each time on what the replay had seen by then
(tuner.workers.replay.LiveReplay.as_of), until it cuts: the time saved is the probe's end less that moment. The probe's
verdict, judged now from its whole records (tuner.analysis.capacity.judge_probe), must be a failure wherever the watch
cuts. Probes the hopeless-trial rule stopped already are counted apart: their records end at that stop.

    .venv/bin/python benchmarks/probe_verdict.py stored [--results benchmarks/results] [--json OUT.json]

`cpu` measures it live instead: the tiny model (written to --model if absent) on the bundled trace, probed at the
same four loads in every run, from four times what the machine carries down to about half of it, with the watch and
without it in turn, --repeats times each (ABAB...), each a launch of its own; per run the replay's seconds and every
probe's load, verdict and length. The loads are fixed rather than searched, so that each probe compares across
runs: a search's path follows its verdicts, which differ from run to run near the capacity on a busy machine.

    .venv/bin/python benchmarks/probe_verdict.py cpu --model /tmp/tiny [--repeats 2] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import statistics
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.analysis.capacity import JudgedProbe, Verdict, judge_probe  # noqa: E402
from tuner.common.models import write_tiny_model  # noqa: E402
from tuner.common.paths import bundled_trace  # noqa: E402
from tuner.search.pruning import VerdictWatch  # noqa: E402
from tuner.analysis.scoring import Boundary, boundary  # noqa: E402
from tuner.traces.selection import TraceSelection, load_trace  # noqa: E402
from tuner.workers.engine_config import EngineConfig  # noqa: E402
from tuner.workers.probes import Probe, ProbeRun  # noqa: E402
from tuner.workers.replay import LiveReplay  # noqa: E402
from tuner.workers.request_record import RequestRecord  # noqa: E402
from tuner.workers.trial import TrialSpec, run_trial  # noqa: E402

POLL_S = 0.25  # how often a replay asks its watch (tuner.workers.replay.replay)
TRIAL_FILE = re.compile(r"(?:^|/)trials/(?:[^/]+/)?trial-(\d+)/(measurement\.json|requests\.csv)$")


@dataclass(frozen=True)
class ProbeReplayed:
    """One stored probe with the watch replayed over its requests."""

    run: str  # the results folder it was read from first
    trial: int
    probe: int
    factor: float
    offered_rps: float | None
    requests: int
    replay_s: float  # the probe's replay as measured: its start to its last response
    stored_verdict: str | None  # as the study stored it (export.json); None where it kept none
    verdict_now: str  # judged now from its whole records
    cut_at_s: float | None  # when the watch would have cut it; None where it would not
    saved_s: float  # replay_s - cut_at_s, or 0
    reason: str | None


def _trial_files(folder: Path) -> Iterator[tuple[int, dict[str, bytes]]]:
    """Each stored trial's measurement.json and requests.csv, by trial number, from the folder's archives and files."""
    found: dict[int, dict[str, bytes]] = {}
    for archive in sorted(folder.glob("*.tar.gz")):
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                if (match := TRIAL_FILE.search(member.name)) and member.isfile() and "longer" not in member.name:
                    data = tar.extractfile(member)
                    if data is not None:
                        found.setdefault(int(match[1]), {})[match[2]] = data.read()
    for path in folder.glob("trials/trial-*/*"):
        if match := TRIAL_FILE.search(str(path.relative_to(folder))):
            found.setdefault(int(match[1]), {})[match[2]] = path.read_bytes()
    for trial, files in sorted(found.items()):
        if {"measurement.json", "requests.csv"} <= files.keys():
            yield trial, files


def cut_at(records: list[RequestRecord], replay_s: float, watch: VerdictWatch) -> tuple[float, str] | None:
    """When, polled every POLL_S from the replay's start, the watch would have cut it, and why; None if never."""
    t = POLL_S
    while t < replay_s:
        if (reason := watch(LiveReplay.as_of(records, t, replay_s))) is not None:
            return t, reason
        t += POLL_S
    return None


def replay_folder(folder: Path, seen: set[tuple[str, int, float]]) -> tuple[list[ProbeReplayed], int]:
    """Every probe of the folder's trials not in `seen` (each kept by its configuration, seed and measured
    duration), replayed; and how many of them the hopeless-trial rule had stopped already."""
    export = json.loads((folder / "export.json").read_text())
    bound: Boundary = boundary(export["study"]["boundary"], export["study"]["limits"])
    stored = {(t["trial_number"], p["index"]): p["verdict"] for t in export["trials"] for p in t.get("probes") or []}
    watch = VerdictWatch(bound)
    replayed, pruned = [], 0
    for trial, files in _trial_files(folder):
        record = json.loads(files["measurement.json"])
        rows = list(csv.DictReader(io.StringIO(files["requests.csv"].decode())))
        for data in record.get("probes") or []:
            probe = Probe.from_dict(data)
            if probe.measurement is None:
                continue
            key = (json.dumps(record["engine_config"], sort_keys=True), probe.seed, probe.measurement.duration_s)
            if key in seen:
                continue
            seen.add(key)
            if probe.stop_reason is not None:
                pruned += 1
                continue
            records = [RequestRecord.from_row(r) for r in rows if int(r["probe"]) == probe.index]
            verdict = judge_probe(probe, records, bound).verdict
            replay_s = probe.measurement.duration_s
            cut = cut_at(records, replay_s, watch)
            replayed.append(ProbeReplayed(
                folder.name, trial, probe.index, probe.factor, probe.offered_rps, len(records), replay_s,
                stored.get((trial, probe.index)), verdict.value, cut[0] if cut else None,
                replay_s - cut[0] if cut else 0.0, cut[1] if cut else None))
    return replayed, pruned


def summary(probes: list[ProbeReplayed], pruned: int) -> dict:
    """The figures the issue asks for: probes, probes cut, seconds saved, the share of replay time, verdicts changed."""
    cut = [p for p in probes if p.cut_at_s is not None]
    saved = [p.saved_s for p in cut]
    total_s = sum(p.replay_s for p in probes)
    return {
        "probes": len(probes), "stopped_by_the_prune_already": pruned,
        "verdicts": {v.value: sum(p.verdict_now == v.value for p in probes) for v in Verdict},
        "cut": len(cut), "failing_not_cut": sum(p.verdict_now == Verdict.FAIL.value and p.cut_at_s is None
                                                for p in probes),
        "replay_s": total_s, "saved_s": sum(saved), "saved_share": sum(saved) / total_s if total_s else 0.0,
        "saved_per_cut_s": {"mean": statistics.fmean(saved), "median": statistics.median(saved), "min": min(saved),
                            "max": max(saved)} if saved else None,
        "saved_share_of_cut_probes": sum(saved) / sum(p.replay_s for p in cut) if cut else 0.0,
        # Must be 0: a cut probe whose whole run the judge does not fail.
        "verdicts_changed": sum(p.verdict_now != Verdict.FAIL.value for p in cut),
        # The judge as it stands against the verdict the study stored (the rules changed between runs).
        "judged_now_unlike_stored": sum(p.stored_verdict is not None and p.stored_verdict != p.verdict_now
                                        for p in probes),
        "reasons": {kind: sum(kind in (p.reason or "") for p in cut)
                    for kind in ("first token", "end to end", "completion ratio", "makespan", "did not keep up")},
    }


def stored(results: Path, out: Path | None) -> None:
    """The watch replayed over every stored H100 probe, with the summary printed (and written to `out`)."""
    seen: set[tuple[str, int, float]] = set()
    probes, pruned = [], 0
    for folder in sorted(results.glob("h100-llama8b-prod-*")):
        found, stopped = replay_folder(folder, seen)
        probes += found
        pruned += stopped
    figures = summary(probes, pruned)
    for p in probes:
        cut = f"cut at {p.cut_at_s:5.2f} s, {p.saved_s:5.1f} s saved: {p.reason}" if p.cut_at_s is not None else ""
        print(f"{p.run:34} trial {p.trial:2} probe {p.probe} x{p.factor:<5.3g} {p.offered_rps or 0:5.1f} req/s "
              f"{p.replay_s:5.1f} s {p.verdict_now:12} {cut}")
    f = figures
    per_cut = f["saved_per_cut_s"] or {"mean": 0.0, "median": 0.0, "min": 0.0, "max": 0.0}
    print(f"\n{f['probes']} probes ran to their end ({f['stopped_by_the_prune_already']} more stopped by the prune "
          f"already): {f['verdicts']}; {f['cut']} cut by the verdict watch ({f['failing_not_cut']} failing probes not "
          f"cut), saving {f['saved_s']:.1f} s of {f['replay_s']:.1f} s replayed ({f['saved_share']:.1%}; "
          f"{f['saved_share_of_cut_probes']:.1%} of the cut probes' time); per cut probe mean {per_cut['mean']:.1f} s, "
          f"median {per_cut['median']:.1f} s, {per_cut['min']:.1f}-{per_cut['max']:.1f} s; verdicts changed: "
          f"{f['verdicts_changed']}; judged now unlike stored: {f['judged_now_unlike_stored']}")
    if out:
        out.write_text(json.dumps({"summary": figures, "probes": [asdict(p) for p in probes]}, indent=1) + "\n")


@dataclass(frozen=True)
class Ladder:
    """A load plan of the same loads in every run, whatever the verdicts (a LoadPlan: tuner.workers.probes)."""

    factors: tuple[float, ...]
    warmup_requests: int = 8
    min_requests: int = 80  # a study's --probe-requests default
    min_span_s: float = 5.0

    def next_factor(self, runs: Sequence[ProbeRun]) -> float | None:
        """The next of the factors, or None once all ran."""
        return self.factors[len(runs)] if len(runs) < len(self.factors) else None


# The CPU run: the bundled trace's first 16 requests at 20 times their rate (about 27 req/s; the tiny model carries
# about 25 on 2 cores, 8 sequences at a time), probed at 4, 2, 1 and 0.5 times that under the interactive boundary.
CPU_SELECTION = TraceSelection(max_requests=16, rate_scale=20.0, fit="clip")
CPU_ENGINE = ["max_model_len=1024", "enforce_eager=true", "kv_cache_memory_bytes=268435456", "max_num_seqs=8"]
CPU_LADDER = Ladder((4.0, 2.0, 1.0, 0.5))


def cpu_run(model: Path, watched: bool, out_dir: Path) -> dict:
    """One launch's probes, with the verdict watch or without it: its replay time and each probe."""
    bound = boundary("interactive")
    config = EngineConfig.from_assignments(CPU_ENGINE)
    trace = load_trace(bundled_trace(), CPU_SELECTION, config.max_model_len)
    spec = TrialSpec(model, trace, config, out_dir, verdict_rule=VerdictWatch(bound) if watched else None,
                     load=CPU_LADDER)
    outcome = run_trial(spec)
    judged = [JudgedProbe.of(run, bound) for run in outcome.probes]
    return {"watched": watched, "replay_s": outcome.record.timings.replay_s,
            "startup_s": outcome.record.timings.startup_s,
            "probes": [{"factor": j.probe.factor, "offered_rps": j.probe.offered_rps, "verdict": j.verdict.value,
                        "duration_s": j.probe.measurement.duration_s if j.probe.measurement else None,
                        "outcomes": j.probe.measurement.outcomes if j.probe.measurement else None,
                        "idle_wait_s": j.probe.idle_wait_s, "cut_by_verdict": j.probe.cut_by_verdict,
                        "reasons": j.reasons} for j in judged]}


def cpu(model: Path, repeats: int, out: Path | None) -> None:
    """The load search run with the watch and without it in turn, `repeats` times each, side by side."""
    if not (model / "config.json").exists():
        write_tiny_model(model)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(repeats):
            for watched in (True, False):
                run = cpu_run(model, watched, Path(scratch) / f"run-{i}-{'watched' if watched else 'whole'}")
                runs.append(run)
                ladder = ", ".join(f"x{p['factor']:.3g} {p['verdict']} {p['duration_s'] or 0:.1f} s"
                                   + (" (cut)" if p["cut_by_verdict"] else "") for p in run["probes"])
                print(f"{'watched' if watched else 'whole  '} replay {run['replay_s']:6.1f} s: {ladder}", flush=True)
    by_arm = {arm: [r["replay_s"] for r in runs if r["watched"] is (arm == "watched")] for arm in ("watched", "whole")}
    for arm, times in by_arm.items():
        print(f"{arm}: replay {statistics.fmean(times):.1f} s mean, {min(times):.1f}-{max(times):.1f} s")
    # Each load's verdicts in each arm: the watch must fail no load the whole probes did not.
    for i, factor in enumerate(CPU_LADDER.factors):
        verdicts = {arm: [r["probes"][i]["verdict"] for r in runs if r["watched"] is (arm == "watched")]
                    for arm in ("watched", "whole")}
        print(f"x{factor:g}: watched {verdicts['watched']}, whole {verdicts['whole']}")
    if out:
        out.write_text(json.dumps({"engine": CPU_ENGINE, "selection": asdict(CPU_SELECTION),
                                   "ladder": asdict(CPU_LADDER), "boundary": boundary("interactive").to_dict(),
                                   "runs": runs}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    on_stored = commands.add_parser("stored", help="the watch replayed over the stored H100 probes")
    on_stored.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    on_stored.add_argument("--json", type=Path)
    on_cpu = commands.add_parser("cpu", help="a load search of the tiny model with the watch and without it")
    on_cpu.add_argument("--model", type=Path, required=True)
    on_cpu.add_argument("--repeats", type=int, default=2)
    on_cpu.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.command == "stored":
        stored(args.results, args.json)
    else:
        cpu(args.model, args.repeats, args.json)


if __name__ == "__main__":
    main()
