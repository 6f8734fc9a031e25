"""The records and inputs that tests build again and again, built in one place: each factory gives a typical
value, and a test names only what matters to it (`study_settings(name="demo")`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from tuner.analysis.capacity import JudgedProbe, Verdict
from tuner.common.hardware import HardwareInfo
from tuner.analysis.kv_budget import ModelMemory
from tuner.storage import StoredTrial, StudyModel, StudySettings
from tuner.traces.selection import TraceSelection
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import classify_failure
from tuner.workers.measure import Measurement, Percentiles, TrialTimings, measure
from tuner.workers.probes import Probe
from tuner.workers.trial import TrialRecord, TrialTrace
from tuner.workers.replay import ReplayResult
from tuner.workers.request_record import Outcome, RequestRecord

# --- inputs of the real runs ------------------------------------------------------------------------------

# The tiny model's engine on the CPU: eager (no compilation to wait for) with an explicit KV budget (vLLM's
# default memory fraction is refused on a small machine).
TINY_ENGINE = {"enforce_eager": True, "max_model_len": 1024, "kv_cache_memory_bytes": 268435456}


def tiny_space(name: str, parameters: dict[str, dict[str, Any]], description: str | None = None,
               fixed: dict[str, Any] | None = None) -> str:
    """A search space's YAML for the tiny model: TINY_ENGINE and `fixed` fixed, `parameters` searched."""
    head = {"name": name} | ({"description": description} if description else {})
    return yaml.safe_dump({**head, "fixed": TINY_ENGINE | (fixed or {}), "parameters": parameters}, sort_keys=False)


def azure_slice(requests: int) -> list[str]:
    """`--window ... --fit clip`: `requests` requests from 300 s into the Azure conversation trace, arriving
    together (rate x100): long answers (about 430 output tokens) on prompts of about 600."""
    return ["--window", "300:400", "--max-requests", str(requests), "--rate-scale", "100", "--fit", "clip"]


# The first 8 requests of the Azure conversation trace, arriving together (rate x100): short answers (16 to 142
# output tokens, 550 in all), for studies whose trials need only to be served, not to fill a KV cache.
SHORT_SLICE = ["--max-requests", "8", "--rate-scale", "100", "--fit", "clip"]


def create_small_study(root: Path, name: str, storage: str, model: Path) -> list[str]:
    """`tuner study create` of a small study (SHORT_SLICE's 8 requests, max_num_seqs 2 to 16, no latency limit, so
    nothing is pruned however loaded the machine), its artifacts in root/artifacts; returns the --storage and
    --artifacts arguments of its other commands."""
    from conftest import AZURE_CONV, FIXED_LOAD, NO_LATENCY_LIMIT_ARGS, run_tuner

    (root / "space.yaml").write_text(tiny_space("small", {"max_num_seqs": {"type": "int", "low": 2, "high": 16}}))
    common = ["--storage", storage, "--artifacts", str(root / "artifacts")]
    run_tuner("study", "create", name, "--model", str(model), "--trace", str(AZURE_CONV), *SHORT_SLICE,
              "--space", str(root / "space.yaml"), *NO_LATENCY_LIMIT_ARGS, *FIXED_LOAD, *common)
    return common


# --- records ----------------------------------------------------------------------------------------------

MACHINE = HardwareInfo("cpu", None, None, 0, "Test CPU", 2, 8.0)


def study_settings(**changes: Any) -> StudySettings:
    """A stored study's settings: study s1 of the tiny model on the Azure trace, interactive boundary."""
    settings = StudySettings(
        name="s1", created_at="2025-05-01T10:00:00+00:00", model="/models/tiny",
        model_info=StudyModel("LlamaForCausalLM", 2048, 2048, 4096,
                              ModelMemory("LlamaForCausalLM", 2, 4, 64, 256, 512, 10_000_000, "bfloat16", 2048)),
        trace_path="/traces/azure_conv_2023.csv", trace_sha256="ab" * 32, trace_selection=TraceSelection((0, 60)),
        boundary="interactive", limits={"ttft_p95_s": 2.0}, space_name="default",
        space_text="max_num_seqs: {low: 8, high: 256}\n", sampler="tpe", seed=7, request_timeout_s=600.0,
        startup_timeout_s=900.0)
    return replace(settings, **changes)


def measurement(**changes: Any) -> Measurement:
    """A trial's measurement: 16 requests, all completed in 10 s, no preemption."""
    m = Measurement(
        requests=16, completed=16, failed=0, outcomes={"ok": 16}, duration_s=10.0, completed_rps=1.6,
        output_tps=120.0, ttft_s=Percentiles(0.1, 0.2, 0.3), e2e_s=Percentiles(1.0, 3.0, 3.5), queue_s_p50=0.1,
        queue_s_p95=0.3, queue_s_mean=0.2, inference_s_mean=1.2, preemptions=0, preemptions_per_100=0.0,
        running_peak=16.0, running_mean=8.0, waiting_peak=0.0, waiting_mean=0.0, kv_usage_peak=0.4,
        prefix_cache_hit_rate=None, requested_output_tokens=1200, actual_output_tokens=1200,
        send_lateness_s=Percentiles(0.0, 0.001, 0.002), metrics_available=True)
    return replace(m, **changes)


def probe_ladder(steps: list[tuple[float, str, float, float]], reference_rps: float = 1.6,
                 **probe: Any) -> list[JudgedProbe]:
    """A trial's judged probes in the order they ran, one per step (factor against the reference load, verdict
    "pass", "fail" or "inconclusive", p95 TTFT s, p95 end-to-end s), each measured as `measurement()` with that
    offered load (`reference_rps` times the factor) and those p95s; one reason for each probe that did not pass.
    `probe` sets the same field of every probe (`stop_reason=...`)."""
    ladder = []
    for index, (factor, verdict, ttft, e2e) in enumerate(steps):
        m = measurement(offered_rps=reference_rps * factor, ttft_s=Percentiles(ttft / 2, ttft, ttft * 1.2),
                        e2e_s=Percentiles(e2e / 2, e2e, e2e * 1.2))
        ladder.append(JudgedProbe(Probe(index, factor, 1000 + index, 100, m, **probe), Verdict(verdict),
                                  [] if verdict == "pass" else [f"probe at x{factor:g}: over a limit"]))
    return ladder


def request_records(count: int) -> list[RequestRecord]:
    """A replay's records: `count - 1` requests served, a quarter second apart (each with the queue time the
    server reported), and a last one never sent."""
    records = [RequestRecord(i, 0.25 * i, 0.25 * i + 0.001, 16, 100 + i, 16, Outcome.OK, ttft_s=0.05, e2e_s=0.4,
                             itl_mean_s=0.02, itl_p95_s=0.03, itl_max_s=0.06, status_code=200,
                             queue_s=0.004 + 0.001 * i)
               for i in range(count - 1)]
    records.append(RequestRecord(count - 1, 0.25 * count, None, 16, 80, 0, Outcome.NOT_SENT,
                                 error="the engine was gone before this request was due"))
    return records


def trial_record(records: list[RequestRecord], *, died: bool) -> TrialRecord:
    """A trial's record as a worker returns it, measured from `records`; `died`: its engine was killed."""
    log = "INFO starting\nINFO serving on port 8000\nERROR worker killed\n"
    return TrialRecord(
        model="/models/tiny", engine_config=EngineConfig(max_num_seqs=64, enable_prefix_caching=True),
        serve_command="vllm serve /models/tiny --max-num-seqs 64",
        trace=TrialTrace("azure_conv_2023.csv", "azure", "ab" * 32, len(records), 3.0, []), hardware=MACHINE,
        vllm_version="0.32.0", started_at="2025-05-01T10:05:00+00:00", timings=TrialTimings(12.5, 3.0, 0.5),
        measurement=measure(ReplayResult(records, 3.0, None, None)),
        failure=classify_failure(-9, log, was_serving=True) if died else None, log_path="/tmp/trial-3.log",
    )


# --- stored studies, without engines ----------------------------------------------------------------------

# A space file that searches max_num_seqs up to 256 (the settings stored with a study keep its text).
SEQS_SPACE = "name: seqs\nparameters:\n  max_num_seqs: {type: int, low: 8, high: 256}\n"


def scored_trial(number: int, capacity_rps: float | None, *, config: EngineConfig | None = None,
                 mark: Any = None, hardware: HardwareInfo = MACHINE, **measured: Any) -> StoredTrial:
    """A completed search trial (or validation launch, `mark`) of study s1 whose load search carried `capacity_rps`
    within the boundary (None: no load passed) and failed 10% above it, measured as `measurement(**measured)`."""
    from tuner.analysis.scoring import Capacity, Score
    from tuner.storage import StoredTrial, TrialState

    m = measurement(**measured)
    score = Score(m.completed_rps, m.e2e_s.p95, m.output_tps, 1.0, {}, [],
                  Capacity(capacity_rps, None, None, capacity_rps * 1.1 if capacity_rps else None, 4, "edge found"))
    return StoredTrial("s1", number, 1, TrialState.COMPLETE, config or EngineConfig(max_num_seqs=64),
                       "vllm serve /models/tiny", m, None, None, None, None, None, None, hardware, "0.32.0",
                       "2025-05-01T10:05:00+00:00", "2025-05-01T10:06:00+00:00", score, validation=mark)


def store_study(url: str, artifacts: Path, settings: StudySettings, trials: list[StoredTrial],
                baseline: int = 0) -> Any:
    """`settings` and `trials` (numbered 0, 1, ...) stored at `url` as a study run would leave them, trial
    `baseline` marked as vLLM's default on Optuna's side; the StoragePlan to read them back with."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from tuner.analysis.scoring import DIRECTIONS
    from tuner.study.attrs import BASELINE_ATTR
    from tuner.study.plan import StoragePlan

    plan = StoragePlan.resolve(url, artifacts)
    repo = plan.repository()
    repo.save_study(settings)
    study = optuna.create_study(study_name=settings.name, storage=plan.optuna_storage(), directions=list(DIRECTIONS))
    for t in sorted(trials, key=lambda t: t.trial_number):
        study.add_trial(create_trial(state=TrialState.COMPLETE, values=[1.0, 1.0],
                                     user_attrs={BASELINE_ATTR: True} if t.trial_number == baseline else {}))
        repo.save_trial(t, [])
    return plan


def native_trace(path: Path, rates_per_hour: list[float], output_tokens: int = 100) -> Path:
    """A native trace at `path`: for each hour in turn, requests evenly spaced at that hour's rate (req/s)."""
    import json

    lines = []
    for hour, rate in enumerate(rates_per_hour):
        count = round(rate * 3600)
        lines += [json.dumps({"arrival_s": hour * 3600 + i * 3600 / count, "input_tokens": 200,
                              "output_tokens": output_tokens}) for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path
