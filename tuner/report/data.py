"""The study as the report reads it: stored trials, the recommendation, the default, and each trial's files.

Every read of storage and of the trials' folders happens here, once, in `collect_report`; the rest of the
report works from the `ReportData` it returns.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState, create_trial

from tuner.analysis.capacity import capacity_of
from tuner.common.errors import TunerError
from tuner.analysis.kv_budget import logged_kv_tokens
from tuner.analysis.scoring import Boundary, Capacity, boundary
from tuner.storage import Repository, StoredTrial, StudyModel, StudySettings, trial_dir
from tuner.storage.records import StoredRun
from tuner.storage.spend import Spend
# The report reads studies (tuner.study.plan, .recommendation) and never imports the runner, nor Ray with it.
from tuner.study.capacity_plan import CapacityPlan, PlanOptions, plan_capacity
from tuner.study.plan import load_optuna_study
from tuner.study.recommendation import Recommendation, find_baseline, recommend
from tuner.workers.engine_config import EngineConfig
from tuner.workers.request_record import RequestRecord
from tuner.workers.server_metrics import TimelineSample

if TYPE_CHECKING:
    from tuner.study.plan import StoragePlan

TIMELINE_FILE = "timeline.csv"  # t_s,running,waiting,kv_usage, sampled every 0.25 s during the replay


def read_timeline(path: Path) -> list[TimelineSample] | None:
    """A trial's sampled timeline (t_s, running, waiting, kv_usage), or None when none was recorded."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    try:
        samples = [TimelineSample(float(r["t_s"]), float(r["running"]), float(r["waiting"]), float(r["kv_usage"]))
                   for r in rows]
    except (KeyError, TypeError, ValueError):
        return None  # a file this report cannot read is shown as no timeline, not as a crash
    return samples or None


def kv_budget_tokens(trial: StoredTrial, model_info: StudyModel, log_path: Path | None = None) -> int | None:
    """Tokens the KV cache held: as vLLM logged it at startup, else as far as the configuration says."""
    if log_path is not None:
        try:
            logged = logged_kv_tokens(log_path.read_text(errors="replace"))
        except OSError:
            logged = None
        if logged is not None:
            return logged
    config = trial.engine_config
    if config.num_gpu_blocks_override and config.block_size:
        return config.num_gpu_blocks_override * config.block_size
    per_token = model_info.kv_bytes_per_token
    if config.kv_cache_memory_bytes and per_token and not config.num_gpu_blocks_override:
        return config.kv_cache_memory_bytes // per_token
    return None


def config_text(config: EngineConfig | dict[str, Any]) -> str:
    """Engine settings as one line, `name=value, ...`; "vLLM defaults" when there are none."""
    settings = config.to_dict() if isinstance(config, EngineConfig) else config
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "vLLM defaults"


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows, read once from the study's storage (or built by hand in tests)."""

    settings: StudySettings
    boundary: Boundary
    trials: tuple[StoredTrial, ...]
    recommendation: Recommendation | None
    baseline: StoredTrial | None  # vLLM's default configuration, as run first
    requests: dict[int, list[RequestRecord]] = field(default_factory=dict)
    timelines: dict[int, list[TimelineSample]] = field(default_factory=dict)  # only the trials that have one
    kv_tokens: dict[int, int] = field(default_factory=dict)
    generated_at: str = ""
    runs: tuple[StoredRun, ...] = ()  # the study's runs, for the time their slots stood idle
    capacity_plan: CapacityPlan | None = None  # replicas for the trace's traffic; None where it cannot be had

    @property
    def spent(self) -> Spend:
        """What the study's answer cost so far."""
        return Spend.of(self.trials, self.runs)

    @property
    def recommended(self) -> StoredTrial | None:
        """The recommended trial, if any trial met the boundary."""
        return self.recommendation.trial if self.recommendation else None

    @property
    def measured(self) -> list[StoredTrial]:
        """Trials with a measurement (complete, pruned, or an engine that died mid-replay)."""
        return [t for t in self.trials if t.measurement]

    @property
    def scored(self) -> list[StoredTrial]:
        """Trials that served and were scored, feasible or not."""
        return [t for t in self.trials if t.scored is not None]

    @property
    def featured(self) -> list[tuple[str, StoredTrial]]:
        """The default and the recommended trial, once each when they are the same trial."""
        base, rec = self.baseline, self.recommended
        if base is not None and rec is not None and base.trial_number == rec.trial_number:
            return [("default and recommended", base)]
        return [(role, t) for role, t in (("default", base), ("recommended", rec)) if t is not None]

    def roles(self, t: StoredTrial) -> list[str]:
        """What the trial is to the study: "default", "recommended", "Pareto" and, for a validation launch,
        "validation N, round R", in that order, as they apply."""
        roles = []
        if self.baseline is not None and t.trial_number == self.baseline.trial_number:
            roles.append("default")
        if self.recommended is not None and t.trial_number == self.recommended.trial_number:
            roles.append("recommended")
        if t.trial_number in self.pareto:
            roles.append("Pareto")
        if t.validation is not None:
            of = "vLLM's default" if t.validation.default else f"trial {t.validation.of_trial}"
            roles.append(f"validation {t.validation.run}, round {t.validation.round}: {of}")
        return roles

    @property
    def searched(self) -> bool:
        """Whether any trial probed its loads (a study with a load search); False for a study at a fixed load."""
        return any(t.probes for t in self.trials)

    def capacity(self, t: StoredTrial) -> Capacity | None:
        """The trial's capacity as it was scored; for a trial whose probes were kept but which was not scored
        (pruned, or its engine died during a later probe), summed up again from those probes; None for a trial
        without probes."""
        if t.scored is not None and t.scored.capacity is not None:
            return t.scored.capacity
        if not t.probes:
            return None
        return capacity_of(t.probes, self.settings.load.for_launch(t.validation is not None),
                           self.settings.trace_selection.rate_scale or 1.0)

    @cached_property
    def pareto(self) -> frozenset[int]:
        """Numbers of the trials on the Pareto front (feasible ones only), as Optuna computes it."""
        if not self.scored:
            return frozenset()
        return frozenset(t.number for t in pareto_study(self.trials).best_trials)


def collect_report(name: str, plan: StoragePlan) -> ReportData:
    """Read a study back: its trials, recommendation, default, request rows, timelines and KV budgets."""
    repo = plan.repository()
    settings = repo.get_study(name)
    study = load_optuna_study(name, plan)
    trials = tuple(repo.trials(name))
    rec = recommend(repo, settings, study)
    baseline = rec.baseline if rec is not None else find_baseline(list(trials), study)
    requests, timelines, kv = {}, {}, {}
    for t in trials:
        folder = trial_dir(plan.artifact_dir, name, t.trial_number)
        if t.measurement:
            requests[t.trial_number] = repo.requests(name, t.trial_number)
            timeline = read_timeline(folder / TIMELINE_FILE)
            if timeline:
                timelines[t.trial_number] = timeline
        tokens = kv_budget_tokens(t, settings.model_info, folder / "server.log")
        if tokens is not None:
            kv[t.trial_number] = tokens
    return ReportData(settings, boundary(settings.boundary, settings.limits), trials, rec, baseline, requests,
                      timelines, kv, datetime.now(timezone.utc).isoformat(timespec="seconds"), tuple(repo.runs(name)),
                      _default_plan(repo, settings, study))


def _default_plan(repo: Repository, settings: StudySettings, study: optuna.Study) -> CapacityPlan | None:
    """The plan `tuner study plan` gives with its defaults; None where it cannot be had (nothing measured, the
    trace unreadable here): the report then leaves its plot out."""
    try:
        return plan_capacity(repo, settings, study, PlanOptions())
    except TunerError:
        return None


# --- the Pareto front, through Optuna --------------------------------------------------------------------


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs errors only inside the block (its info and warnings are noise in a report)."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def pareto_study(trials: Sequence[StoredTrial]) -> optuna.Study:
    """An in-memory Optuna study of the scored search trials (numbered as in the real study), so that the
    Pareto front is Optuna's own, and neither launch-less rejections nor validation launches (repeats of
    configurations already on it) stretch the axes or crowd the front."""
    with quiet_optuna():
        study = optuna.create_study(directions=["maximize", "minimize"])
    scored = {t.trial_number: t for t in trials if t.scored is not None and t.validation is None}
    last = max((t.trial_number for t in trials), default=-1)
    for number in range(last + 1):
        t = scored.get(number)
        if t is None:
            study.add_trial(create_trial(state=TrialState.FAIL))  # a placeholder, so that numbers match
            continue
        attrs = {"config": config_text(t.engine_config), "preemptions": t.measurement.preemptions}
        if t.scored.violations:
            attrs["violations"] = t.scored.violations
        study.add_trial(create_trial(values=list(t.scored.objectives), user_attrs=attrs,
                                     constraints=dict(t.scored.constraints or {"feasible": 0.0})))
    return study
