"""Making a study: checked and stored with its baseline enqueued (`create_study`), configurations queued ahead
of the sampler (`enqueue_config`), and a stored study loaded back ready to run (`study_context`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import optuna

from tuner.common.errors import TunerError
from tuner.common.hardware import detect_hardware
from tuner.analysis.kv_budget import DeviceMemory, ModelMemory, read_model_memory
from tuner.common.models import ModelInfo, inspect_model
from tuner.search.samplers import DEFAULT_SAMPLER, make_sampler
from tuner.analysis.capacity import LoadPolicy, ProbeLength
from tuner.analysis.scoring import DIRECTIONS, OBJECTIVE_NAMES, SEARCH_OBJECTIVE_NAMES, Boundary, boundary
from tuner.search_spaces import SearchSpace, SpaceContext, load_space, parse_space
from tuner.search_spaces.context import NOT_ALLOWED
from tuner.search_spaces.derive import AUTO_SPACE, derive_space
from tuner.storage import StudyModel, StudySettings
from tuner.study.attrs import BASELINE_ATTR, ON_DEFAULT_ATTR
from tuner.study.plan import StoragePlan, load_optuna_study
from tuner.traces.records import Trace
from tuner.traces.selection import TraceSelection, load_trace
from tuner.traces.stats import trace_stats
from tuner.workers.engine_config import EngineConfig


# With no trace of your own, a study replays the bundled demo: the Azure cut's first 16 requests at six times their
# recorded rate (about 8 req/s), clipped to the model's context, searched at 25% precision with probes of at least
# 10 s. The load search goes below that traffic as far as the machine needs, so the demo's answer does not hang on
# the machine's speed; only its time does.
DEMO_SELECTION = TraceSelection(max_requests=16, rate_scale=6.0, fit="clip")
DEMO_LOAD = LoadPolicy(precision=0.25, probe_seconds=10.0)


def study_defaults(own_trace: bool) -> tuple[TraceSelection, LoadPolicy]:
    """What a study's selection and load search take where `study create` leaves them out: the general defaults
    for a trace of your own, the demo's for the bundled one."""
    return (TraceSelection(), LoadPolicy()) if own_trace else (DEMO_SELECTION, DEMO_LOAD)


@dataclass(frozen=True)
class StudyContext:
    """A stored study made ready to run: its space, boundary and trace, checked against what was stored."""

    settings: StudySettings
    space: SearchSpace
    boundary: Boundary
    selection: TraceSelection
    trace: Trace  # windowed, capped, rate-scaled; fitted per trial
    space_context: SpaceContext


def stored_space(settings: StudySettings) -> SearchSpace:
    """The space exactly as stored with the study (the file it came from may have changed since). Parsed from
    the stored text, never through a shared scratch file: drivers starting at once would read half-written ones."""
    return parse_space(settings.space_text, Path(f"{settings.space_name}.yaml"))


def study_context(settings: StudySettings) -> StudyContext:
    """The stored study made ready to run; TunerError if its trace file changed since it was created."""
    selection = settings.trace_selection
    trace = load_trace(settings.trace_path, selection)
    if trace.sha256 != settings.trace_sha256:
        raise TunerError(f"{settings.trace_path} changed since study {settings.name!r} was created "
                         f"(sha256 {trace.sha256[:12]}, stored {settings.trace_sha256[:12]})")
    space = stored_space(settings)
    # The model's sizes as stored at creation (no transformers import per run); a study created before they
    # were stored reads them from the folder.
    memory = settings.model_info.memory or read_model_memory(settings.model)
    return StudyContext(settings, space, boundary(settings.boundary, settings.limits), selection, trace,
                        machine_space_context(inspect_model(settings.model), memory, trace, selection.fit,
                                              settings.allow_fp8))


def machine_space_context(info: ModelInfo, memory: ModelMemory, trace: Trace, fit: str | None,
                          allow_fp8: bool = False) -> SpaceContext:
    """What a proposal is judged against on this machine, its estimated KV cache included, and whether it may
    change the model's numerics (FP8: where the study allows it and this machine runs it)."""
    hardware = detect_hardware()
    platform = "cuda" if hardware.accelerator == "cuda" else "cpu"
    refused = hardware.fp8_unsupported() if allow_fp8 else NOT_ALLOWED
    return SpaceContext.for_run(platform, info, trace, fit, memory, DeviceMemory.of_machine(hardware), refused)


@dataclass(frozen=True)
class CreatedStudy:
    """A study just stored, and how long its trials will replay."""

    settings: StudySettings
    probe_length: ProbeLength


def create_study(name: str, *, model: str | Path, trace_path: str | Path, selection: TraceSelection,
                 space: str | Path, boundary_name: str, limits: dict, plan: StoragePlan, sampler: str = DEFAULT_SAMPLER,
                 seed: int | None = None, request_timeout_s: float = 600.0,
                 startup_timeout_s: float = 600.0, load: LoadPolicy | None = None,
                 allow_fp8: bool = False) -> CreatedStudy:
    """Check everything a run will need, then store the study and enqueue its baseline."""
    if not name or len(name) > 200:
        raise TunerError("a study name must be 1 to 200 characters")
    make_sampler(sampler, seed)
    load = load or LoadPolicy()
    bound = boundary(boundary_name, limits)
    info = inspect_model(model)
    trace = load_trace(trace_path, selection)
    load.refuse_undecidable(bound, len(trace.requests), trace.span_s)
    probe_length = ProbeLength.of(trace, load, bound)
    memory = read_model_memory(model)
    # FP8 changes the model's numerics: searched only by its creator's choice, and only where the machine runs it.
    if allow_fp8 and (unsupported := detect_hardware().fp8_unsupported()):
        raise TunerError(f"--allow-fp8: {unsupported}")
    space_context = machine_space_context(info, memory, trace, selection.fit, allow_fp8)
    loaded_space = (derive_space(memory, space_context.device, trace, selection.fit, fp8=allow_fp8).space
                    if str(space) == AUTO_SPACE else load_space(space))
    if not allow_fp8 and (numerics := loaded_space.numerics_settings()):
        raise TunerError(f"space {loaded_space.name} searches FP8 ({', '.join(numerics)}), which changes the "
                         f"model's numerics: create the study with --allow-fp8 to search it")
    refused = loaded_space.violations(loaded_space.baseline(), space_context)
    if refused:
        raise TunerError(f"the space's baseline (its fixed values) would be refused: {'; '.join(refused)}")
    repo = plan.repository()
    storage = plan.optuna_storage()
    if name in {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)} \
            or name in {s.name for s in repo.list_studies()}:
        raise TunerError(f"study {name} already exists")
    settings = StudySettings(
        name=name, created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model=str(Path(model).resolve()),
        model_info=StudyModel.of(info, memory),
        trace_path=str(Path(trace_path).resolve()), trace_sha256=trace.sha256, trace_selection=selection,
        boundary=bound.name, limits=limits, space_name=loaded_space.name, space_text=loaded_space.text,
        sampler=sampler, seed=seed, request_timeout_s=request_timeout_s, startup_timeout_s=startup_timeout_s,
        load=load, allow_fp8=allow_fp8)
    repo.save_study(settings)
    repo.save_trace(trace, trace_stats(trace))
    study = optuna.create_study(study_name=name, storage=storage, directions=list(DIRECTIONS))
    study.set_metric_names(list(SEARCH_OBJECTIVE_NAMES if load.mode == "search" else OBJECTIVE_NAMES))
    study.set_user_attr("boundary", bound.to_dict())
    study.set_user_attr("space", loaded_space.name)
    study.enqueue_trial({}, user_attrs={BASELINE_ATTR: True})
    # Where FP8 is allowed, vLLM's default with it comes next: on Hopper GPUs precision moves capacity where the
    # scheduler's settings may not, so a short budget measures it first.
    if allow_fp8 and (precision := loaded_space.precision()):
        study.enqueue_trial(precision, user_attrs={ON_DEFAULT_ATTR: sorted(precision)})
    return CreatedStudy(settings, probe_length)


def enqueue_config(name: str, plan: StoragePlan, config: EngineConfig, user_attrs: dict | None = None) -> None:
    """Queue a configuration to be run next, ahead of the sampler (a known good one, or one to check).

    Its searched settings become the trial's parameters; settings the space fixes must agree with it."""
    repo = plan.repository()
    settings = repo.get_study(name)
    space = stored_space(settings)
    values = config.to_dict()
    for key, fixed in space.fixed.items():
        if key in values and values[key] != fixed:
            raise TunerError(f"{key} is fixed to {fixed!r} in space {space.name}, got {values[key]!r}")
    unknown = sorted(set(values) - set(space.fixed) - set(space.parameters))
    if unknown:
        raise TunerError(f"{unknown[0]} is not searched in space {space.name}: "
                         f"searched are {', '.join(sorted(space.parameters)) or 'none'}")
    load_optuna_study(name, plan).enqueue_trial({k: v for k, v in values.items() if k in space.parameters},
                                                user_attrs=user_attrs, skip_if_exists=False)


def latest_trace(folder: str | Path) -> Path:
    """The most recently modified file in `folder`, hidden files aside (a tie goes to the later name)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TunerError(f"{folder} is not a folder")
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    if not files:
        raise TunerError(f"no trace file in {folder}")
    return max(files, key=lambda p: (p.stat().st_mtime, p.name))
