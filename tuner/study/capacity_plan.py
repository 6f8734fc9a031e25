"""A stored study's capacity plan: how many replicas of vLLM's default, of the recommendation and of the best at the
model's own precision carry the user's traffic within the boundary, at its peak and hour by hour over a day, and
whether a setting or another replica is what each one's measurement supports.

The arithmetic is `tuner.analysis.replicas`; this module reads the study (its recommendation, validation and trace) and
says where each figure comes from.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.analysis.diagnosis import Limit, LimitingResource
from tuner.common.errors import TunerError
from tuner.analysis.replicas import (DEFAULT_HEADROOM, DEFAULT_PEAK_WINDOW_S, LARGEST, DayPlan, MeasuredCapacity,
                                     PeakRate, ReplicaCount, busiest_window, check_headroom, check_price, check_rate,
                                     day_plan, hourly_rates, replicas_for)
from tuner.analysis.scoring import boundary
from tuner.study.recommendation import Recommendation, find_baseline, recommend, trial_limit
from tuner.traces.readers import read_trace
from tuner.traces.transforms import spread_buckets
from tuner.validation import capacity_interval

if TYPE_CHECKING:
    import optuna

    from tuner.search_spaces.space import SearchSpace
    from tuner.storage import Repository, StoredTrial, StudySettings
    from tuner.traces.records import Trace

CAPACITY_PLAN_ATTR = "capacity_plan"  # the Optuna study user attribute the dashboard shows the latest plan's summary in
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# The setting that relieves each limit, where the space can still raise it.
RELIEVING_SETTING = {Limit.MAX_NUM_SEQS: "max_num_seqs", Limit.TOKEN_BUDGET: "max_num_batched_tokens",
                     Limit.KV_CACHE: "gpu_memory_utilization"}


@dataclass(frozen=True)
class PlanOptions:
    """What the user asks of a plan: a peak (else the trace's busiest window), the scale of the trace's rate (else
    the study's), a day's rates (else the trace's own curve), a price per GPU-hour, and the headroom."""

    peak_rps: float | None = None
    peak_window_s: float = DEFAULT_PEAK_WINDOW_S
    scale: float | None = None  # None: the study's rate scale
    hourly_rps: tuple[float, ...] | None = None  # 24 rates given by hand (--rates FILE)
    gpu_hour_usd: float | None = None
    headroom: float = DEFAULT_HEADROOM
    day: bool = False  # a daily plan was asked for: a trace too short for one is an error

    def __post_init__(self) -> None:
        check_headroom(self.headroom)
        check_price(self.gpu_hour_usd)
        if self.peak_rps is not None:
            check_rate("--peak", self.peak_rps)
        for hour, rps in enumerate(self.hourly_rps or ()):
            check_rate(f"the rate of hour {hour}", rps, zero=True)
        if self.scale is not None and not 0 < self.scale <= LARGEST:
            raise TunerError(f"--scale must be above 0, got {self.scale:g}")
        if not 0 < self.peak_window_s < math.inf:
            raise TunerError(f"--peak-window must be above 0 seconds, got {self.peak_window_s:g}")


@dataclass(frozen=True)
class Traffic:
    """The traffic planned for and where each part comes from."""

    trace: str  # which requests: the whole trace file (the user's traffic), not only the window a study replays
    scale: float  # the trace's recorded rate times this
    scale_source: str
    peak: PeakRate
    peak_source: str
    hourly_rps: tuple[float, ...] | None
    day_source: str  # where the day's rates come from, or why there are none
    output_tokens_per_request: float | None  # the trace's mean; None without a readable trace

    def to_dict(self) -> dict[str, Any]:
        """For programs: every field, the peak as a record."""
        return {"trace": self.trace, "scale": self.scale, "scale_source": self.scale_source,
                "peak": self.peak.to_dict(), "peak_source": self.peak_source,
                "hourly_rps": list(self.hourly_rps) if self.hourly_rps else None, "day_source": self.day_source,
                "output_tokens_per_request": self.output_tokens_per_request}


@dataclass(frozen=True)
class ConfigurationPlan:
    """One configuration's share of the plan: its capacity and where it comes from, replicas at the peak and over a
    day, and the seed's question answered from its limiting resource (a setting, or another replica)."""

    role: str  # "vLLM's default", "recommended", both, or "best at the model's own precision"
    trial: int
    serve_command: str
    capacity: MeasuredCapacity | None
    capacity_source: str  # which measurement, or why there is none
    slots_per_replica: int
    peak_replicas: ReplicaCount | None
    day: DayPlan | None
    limiting_resource: LimitingResource | None
    remedy: str

    def to_dict(self) -> dict[str, Any]:
        """For programs: every field, records as their dicts."""
        return {"role": self.role, "trial": self.trial, "serve_command": self.serve_command,
                "capacity": self.capacity.to_dict() if self.capacity else None,
                "capacity_source": self.capacity_source, "slots_per_replica": self.slots_per_replica,
                "peak_replicas": self.peak_replicas.to_dict() if self.peak_replicas else None,
                "day": self.day.to_dict() if self.day else None,
                "limiting_resource": self.limiting_resource.to_dict() if self.limiting_resource else None,
                "remedy": self.remedy}


@dataclass(frozen=True)
class CapacityPlan:
    """A study's capacity plan: the traffic, the headroom assumed, the unit of the hours and each configuration."""

    study: str
    headroom: float
    unit: str  # "GPU" or "CPU slot"
    gpu_hour_usd: float | None
    traffic: Traffic
    configurations: tuple[ConfigurationPlan, ...]
    notes: tuple[str, ...]  # what the plan could not use, said plainly

    def to_dict(self) -> dict[str, Any]:
        """For programs (`tuner study plan --json`, the service's answer)."""
        return {"study": self.study, "headroom": self.headroom, "unit": self.unit, "gpu_hour_usd": self.gpu_hour_usd,
                "traffic": self.traffic.to_dict(), "configurations": [c.to_dict() for c in self.configurations],
                "notes": list(self.notes)}

    def summary(self) -> dict[str, Any]:
        """What the dashboard shows of it: the peak and, per configuration, its replicas there and its slot-hours a
        day (strings, as the dashboard lists attributes)."""
        def one(c: ConfigurationPlan) -> str:
            peak = c.peak_replicas.text() if c.peak_replicas else "no capacity"
            day = (f", {_range(c.day.slot_hours, '.0f')} {self.unit}-hours a day" if c.day else "")
            return f"trial {c.trial} ({c.role}): {peak}{day}"

        return {"peak_rps": round(self.traffic.peak.rps, 4), "headroom": self.headroom,
                "configurations": [one(c) for c in self.configurations]}


def _range(pair: tuple[float, float], spec: str) -> str:
    low, high = (format(v, spec) for v in pair)
    return low if low == high else f"{low} to {high}"


def measured_capacity(trial: StoredTrial, recommendation: Recommendation, searched: bool
                      ) -> tuple[MeasuredCapacity | None, str]:
    """A configuration's capacity within the boundary and where it comes from: its validation launches' geometric
    mean with a 95% interval (`capacity_interval`), else the search's one measurement, else None and why."""
    if not searched:
        return None, "the study ran at a fixed load: no capacity was measured"
    validation, base = recommendation.validation, recommendation.baseline
    arm = None
    if validation is not None:
        is_default = base is not None and trial.trial_number == base.trial_number
        arm = validation.default if is_default else validation.arm_of(trial.trial_number)
    if arm is not None and len(arm.values) >= 2 and arm.carried_every_time:
        assert validation is not None
        return (capacity_interval(arm.values, validation.resolution, arm.bracket),
                f"validation {validation.run}: {len(arm.values)} launches")
    score = trial.scored
    if score is None or score.capacity is None or score.capacity.rps is None:
        return None, "no load was carried within the boundary"
    why = f"; its validation launches gave no interval ({arm.nothing_carried()})" if arm is not None else ""
    return MeasuredCapacity.once(score.carried_rps), f"the search, measured once{why}"


def space_highest(space: SearchSpace, setting: str) -> float | None:
    """The highest value the space lets `setting` take (searched or fixed); None where it leaves it to vLLM."""
    # lazy: keeps the CLI's start fast (the search spaces' pydantic models, YAML)
    from tuner.search_spaces.parameters import CategoricalParameter

    if setting in space.fixed:
        fixed = space.fixed[setting]
        return float(fixed) if isinstance(fixed, (int, float)) else None
    parameter = space.parameters.get(setting)
    if parameter is None:
        return None
    if isinstance(parameter, CategoricalParameter):
        numbers = [float(c) for c in parameter.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        return max(numbers, default=None)
    return float(parameter.high)


def remedy(limit: LimitingResource | None, trial: StoredTrial, space: SearchSpace | None) -> str:
    """The seed's question: whether a setting within the space or another replica is what the measurement supports,
    from the limiting resource at the edge of the trial's capacity."""
    if limit is None:
        return "no limit measured: nothing says whether a setting or another replica would carry more"
    waiting = limit.evidence.get("waiting_peak") or 0
    at = f" at {limit.at_rps:.3g} req/s" if limit.at_rps else ""
    queue = f"its queue grew ({waiting:g} waiting{at}); " if waiting else ""
    setting = RELIEVING_SETTING.get(limit.kind)
    if setting is None:
        if limit.kind is Limit.COMPUTE:
            return f"{queue}another replica: the engine itself is the limit (compute, nothing at a cap)"
        why = ("vLLM's gauges were read too seldom to name a limit" if limit.kind is Limit.UNREAD
               else "nothing was at a cap and throughput still grew with load")
        return f"{queue}neither is supported yet: {why}"
    current = (limit.evidence.get(setting) if setting != "gpu_memory_utilization"
               else trial.engine_config.gpu_memory_utilization or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
    if space is None:
        return f"{queue}a setting, if any: {setting} holds it back; the study's space could not be read"
    highest = space_highest(space, setting)
    if highest is None:
        return (f"{queue}another replica within this space: {setting} holds it back and the space does not search "
                f"it")
    if current is None or highest > current:
        now = f"now {current:g}; " if current is not None else ""
        return f"{queue}a setting: raise {setting} ({now}the space allows up to {highest:g})"
    return f"{queue}another replica: {setting} holds it back and is at the space's top ({highest:g})"


def _trace_traffic(settings: StudySettings, options: PlanOptions) -> tuple[Traffic, list[str]]:
    notes: list[str] = []
    study_scale = settings.trace_selection.rate_scale or 1.0
    scale = options.scale if options.scale is not None else study_scale
    scale_source = ("--scale" if options.scale is not None else
                    "the study's rate scale" if settings.trace_selection.rate_scale else "the trace as recorded")
    trace: Trace | None
    try:
        trace = read_trace(settings.trace_path)
    except TunerError as exc:
        trace = None
        if options.peak_rps is None or (options.day and options.hourly_rps is None):
            raise TunerError(f"study {settings.name}: its trace cannot be read ({exc}); give --peak RPS"
                             + (" and --rates FILE" if options.day else "")) from None
        notes.append(f"the trace cannot be read ({exc}): no output tokens per request, so no cost per token")
    if trace is not None:
        if settings.trace_selection.spread:
            trace = spread_buckets(trace)
        if trace.sha256 != settings.trace_sha256:
            notes.append(f"the trace file {settings.trace_path} changed since the study was created")
    recorded = [r.arrival_s for r in trace.requests] if trace is not None else []
    scaled = f"x{scale:g} its recorded rate ({scale_source})"
    if options.peak_rps is not None:
        peak, peak_source = PeakRate(options.peak_rps, 0.0, 0.0), "--peak"
    elif options.hourly_rps is not None:  # the day the user gave is the traffic planned for: its busiest hour
        busiest = max(range(len(options.hourly_rps)), key=options.hourly_rps.__getitem__)
        peak = PeakRate(options.hourly_rps[busiest], busiest * 3600.0, 3600.0)
        peak_source = f"the busiest hour of --rates (hour {busiest})"
    else:
        peak = busiest_window([t / scale for t in recorded], options.peak_window_s)
        peak_source = f"the trace's busiest {options.peak_window_s:g} s window at {scaled}"
    hourly: tuple[float, ...] | None
    if options.hourly_rps is not None:
        hourly, day_source = options.hourly_rps, "--rates"
    else:
        # A day on the trace's own clock, each hour's rate scaled: a faster replay of a day is still one day.
        by_hour = hourly_rates(recorded) if recorded else None
        hourly = tuple(rate * scale for rate in by_hour) if by_hour is not None else None
        span_h = (max(recorded) - min(recorded)) / 3600 if recorded else 0.0
        if hourly is not None:
            day_source = f"the trace's arrivals per hour of its own clock at {scaled}, hour 0 its first"
        else:
            day_source = (f"no daily curve: the trace spans {span_h:.2g} hours, less than a day; give --rates FILE"
                          if recorded else "no daily curve: no trace to take it from; give --rates FILE")
            if options.day:
                raise TunerError(f"study {settings.name}: {day_source} (hour,rps, 24 rows)")
    tokens = statistics.fmean(r.output_tokens for r in trace.requests) if trace is not None else None
    source = (f"the whole trace file {Path(settings.trace_path).name}: {len(recorded)} requests over "
              f"{(max(recorded) - min(recorded)) / 3600:.3g} hours as recorded" if recorded else "no trace")
    return Traffic(source, scale, scale_source, peak, peak_source, hourly, day_source, tokens), notes


def plan_capacity(repo: Repository, settings: StudySettings, optuna_study: optuna.Study,
                  options: PlanOptions) -> CapacityPlan:
    """The plan for the stored study: vLLM's default, the recommendation and (where that changes the model's
    numerics) the best at its own precision; TunerError while the study has neither a recommendation nor a run of
    the default, or where the traffic cannot be had (an unreadable trace without --peak)."""
    # lazy: keeps the CLI's start fast (the search spaces' pydantic models, YAML)
    from tuner.search_spaces.loading import parse_space

    rec = recommend(repo, settings, optuna_study)
    if rec is None:
        base = find_baseline(repo.trials(settings.name), optuna_study)
        if base is None or base.scored is None:
            raise TunerError(f"study {settings.name}: no configuration was measured within the boundary yet; "
                             f"nothing to plan")

        rec = Recommendation(base, boundary(settings.boundary, settings.limits), base)
    traffic, notes = _trace_traffic(settings, options)
    try:
        space: SearchSpace | None = parse_space(settings.space_text, Path(settings.space_name))
    except TunerError:
        space = None
    roles: dict[int, tuple[str, StoredTrial]] = {}
    for role, trial in (("vLLM's default", rec.baseline), ("recommended", rec.trial),
                        ("best at the model's own precision", rec.own_precision)):
        if trial is None or trial.scored is None:
            continue
        known = roles.get(trial.trial_number)
        roles[trial.trial_number] = (f"{known[0]} and {role}" if known else role, trial)
    searched = settings.load.mode == "search"
    unit = "CPU slot" if rec.trial.hardware is not None and rec.trial.hardware.accelerator == "cpu" else "GPU"
    configurations = []
    for role, trial in roles.values():
        capacity, source = measured_capacity(trial, rec, searched)
        slots = trial.engine_config.tensor_parallel_size or 1
        day = (day_plan(traffic.hourly_rps, capacity, options.headroom, slots, options.gpu_hour_usd,
                        traffic.output_tokens_per_request)
               if capacity is not None and traffic.hourly_rps is not None else None)
        limit = trial_limit(trial, rec.boundary)
        configurations.append(ConfigurationPlan(
            role, trial.trial_number, trial.serve_command, capacity, source, slots,
            replicas_for(traffic.peak.rps, capacity, options.headroom) if capacity is not None else None, day,
            limit, remedy(limit, trial, space)))
    return CapacityPlan(settings.name, options.headroom, unit, options.gpu_hour_usd, traffic,
                        tuple(configurations), tuple(notes))
