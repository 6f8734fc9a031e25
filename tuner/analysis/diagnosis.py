"""What holds a configuration back, named from vLLM's own figures at the load where it stops meeting its boundary.

A person tuning vLLM by hand reads the engine's figures: preemptions or a full KV cache mean the cache is short;
requests waiting while every sequence slot is taken mean `max_num_seqs` caps concurrency; requests waiting (or
first tokens late) with slots and cache free mean the per-step token budget (`max_num_batched_tokens`) or prefill
compute admits them too slowly; nothing at a cap while throughput stops growing with load means compute. Running
and waiting are vLLM's gauges, read every 0.25 s: where they were read too seldom while requests were in flight,
no limit is named, rather than compute for want of a sign.

`Signs.read` holds these rules once: the bottleneck sampler reads them (from a trial's user attributes) to choose
its next move, and `limiting_resource` names one of them, with its figures, for people (trial run, status, the
report, the dashboard).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Self

from tuner.analysis.capacity import JudgedProbe, Verdict
from tuner.common.hardware import HardwareInfo
from tuner.analysis.scoring import Boundary
from tuner.workers.measure import Measurement

KV_FULL = 0.95  # KV-cache usage from which the cache counts as short even without a preemption
# vLLM's p95 queue time from which waiting requests count as a queue. On the H200 a few requests waiting for a
# moment (p95 0.29 s, the histogram's first bucket) sent the sampler after ever more batched tokens while
# throughput fell; a queue that held the search back was 1.2 s.
QUEUE_NOTICED_S = 0.5
# Throughput counts as still growing with load when the edge probe completed more than this much more than the
# capacity's probe.
STILL_GROWING = 0.10
# Fewer reads of the gauges than this while requests were in flight (a second's worth) cannot show a queue or a cap:
# at 156 req/s on an idle machine, every read of a 32-request burst came before or after it, and compute was named.
MIN_GAUGE_READS = 4
LIMITING_RESOURCE_ATTR = "limiting_resource"  # the Optuna user attribute a measured trial keeps it in


class Limit(StrEnum):
    """The resource that holds a configuration back."""

    KV_CACHE = "kv_cache"
    MAX_NUM_SEQS = "max_num_seqs"
    TOKEN_BUDGET = "max_num_batched_tokens"  # the per-step token budget, or prefill compute behind it
    COMPUTE = "compute"
    NONE_SHOWN = "none_shown"  # nothing at a cap and throughput still grew with load: no limit to name
    UNREAD = "unread"  # vLLM's gauges were read too seldom while requests were in flight to name one


@dataclass(frozen=True)
class Figures:
    """The figures of one measurement the rules read."""

    preemptions: int
    kv_usage_peak: float
    running_peak: float
    waiting_peak: float
    queue_p95_s: float | None
    ttft_p95_s: float | None
    completed_rps: float | None = None

    @classmethod
    def of(cls, m: Measurement) -> Figures:
        """The figures a measurement gives (p95s in seconds; None where it has none)."""
        return cls(m.preemptions, m.kv_usage_peak, m.running_peak, m.waiting_peak, m.queue_s_p95, m.ttft_s.p95,
                   m.completed_rps)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Figures:
        """From a trial's user attributes (`measurement_attrs`); a figure it lacks shows no sign."""
        return cls(attrs.get("preemptions") or 0, attrs.get("kv_usage_peak") or 0.0, attrs.get("running_peak") or 0.0,
                   attrs.get("waiting_peak") or 0.0, attrs.get("queue_p95_s"), attrs.get("ttft_p95_s"))


@dataclass(frozen=True)
class Signs:
    """Which caps one measurement shows."""

    kv_short: bool  # preemptions, or the KV cache (nearly) full
    seqs_capped: bool  # requests waited while every sequence slot was taken
    prefill_slow: bool  # requests waited with slots free, or first tokens came later than the boundary allows

    @classmethod
    def read(cls, f: Figures, max_num_seqs: int | None, ttft_over: bool) -> Self:
        """The rules, once. `max_num_seqs` None: the cap is unknown, so it is never counted as reached."""
        kv_short = f.preemptions > 0 or f.kv_usage_peak >= KV_FULL
        # A queue users notice: requests waited, and (where vLLM says) for long enough to matter.
        waited = f.waiting_peak > 0 and (f.queue_p95_s is None or f.queue_p95_s >= QUEUE_NOTICED_S)
        at_cap = max_num_seqs is not None and f.running_peak >= max_num_seqs
        return cls(kv_short=kv_short, seqs_capped=waited and at_cap and not kv_short,
                   prefill_slow=(waited and not at_cap and not kv_short) or ttft_over)


@dataclass(frozen=True)
class EngineCaps:
    """The scheduler's caps a configuration ran with: as set, else vLLM's default; None where unknown."""

    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    source: str  # "set", "vLLM 0.32's default on <hardware>", or why unknown

    @classmethod
    def of(cls, config: Mapping[str, Any], hardware: HardwareInfo | None) -> EngineCaps:
        """From an engine configuration's set values (`EngineConfig.to_dict()`) and the hardware it ran on.
        vLLM 0.32's `vllm serve` defaults (`EngineArgs.get_batch_defaults`, OpenAI server): on a CPU 128 sequences
        and 2048 tokens per worker; on a GPU of 160 GiB or more 1024 and 16384; of 70 GiB or more (not an A100)
        1024 and 8192; on other GPUs 256 and 2048."""
        seqs, tokens = config.get("max_num_seqs"), config.get("max_num_batched_tokens")
        if seqs is not None and tokens is not None:
            return cls(seqs, tokens, "set")
        default = _vllm_default(hardware, config.get("tensor_parallel_size") or 1)
        if default is None:
            return cls(seqs, tokens, "set" if seqs or tokens else "unknown: no hardware recorded")
        return cls(seqs if seqs is not None else default[0], tokens if tokens is not None else default[1],
                   f"vLLM 0.32's default on {hardware.accelerator if hardware else ''}")


def _vllm_default(hardware: HardwareInfo | None, world_size: int) -> tuple[int, int] | None:
    if hardware is None:
        return None
    if hardware.accelerator == "cpu":
        return 128 * world_size, 2048 * world_size
    memory = hardware.gpu_memory_gib
    if memory is None:
        return None
    if memory >= 160:
        return 1024, 16384
    if memory >= 70 and "a100" not in (hardware.gpu_model or "").lower():
        return 1024, 8192
    return 256, 2048


@dataclass(frozen=True)
class LimitingResource:
    """What holds one configuration back, at the load where it stops meeting its boundary."""

    kind: Limit
    at_rps: float | None  # the offered load it was read at
    evidence: dict[str, Any]  # the figures that support it
    sentence: str  # for people

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, the kind as its value: stored in the trial's LIMITING_RESOURCE_ATTR user attribute and shown in
        reports; from_dict reads it back."""
        return {**asdict(self), "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LimitingResource:
        """The limiting resource `to_dict` gave."""
        return cls(Limit(data["kind"]), data["at_rps"], dict(data["evidence"]), data["sentence"])


def _pct(x: float) -> str:
    return f"{x:.0%}"


def diagnose(m: Measurement, caps: EngineCaps, *, bound: Boundary | None = None,
             capacity: Measurement | None = None) -> LimitingResource:
    """The limiting resource of one measurement. `capacity`: the measurement of the highest passing probe below
    it, after a load search (then compute is named only when throughput stopped growing from it to `m`); None at a
    fixed load (then compute is named when nothing else shows)."""
    f = Figures.of(m)
    signs = Signs.read(f, caps.max_num_seqs, bound is not None and bound.ttft_over(m))
    evidence: dict[str, Any] = {
        "kv_usage_peak": round(f.kv_usage_peak, 4), "preemptions": f.preemptions, "running_peak": f.running_peak,
        "waiting_peak": f.waiting_peak, "queue_p95_s": f.queue_p95_s, "ttft_p95_s": f.ttft_p95_s,
        "completed_rps": f.completed_rps, "max_num_seqs": caps.max_num_seqs,
        "max_num_batched_tokens": caps.max_num_batched_tokens, "gauge_reads": m.gauge_reads}
    at = m.offered_rps
    where = f" at {at:.3g} req/s" if at else ""
    waiting = f"{f.waiting_peak:g} requests waiting"
    cap = f"max_num_seqs {caps.max_num_seqs}" if caps.max_num_seqs is not None else "max_num_seqs unknown"
    if signs.kv_short:
        return LimitingResource(Limit.KV_CACHE, at, evidence,
                                f"the KV cache{where}: usage peaked at {_pct(f.kv_usage_peak)}, {f.preemptions} "
                                f"preemptions, {waiting} with {f.running_peak:g} running ({cap})")
    if m.gauge_reads is not None and m.gauge_reads < MIN_GAUGE_READS:
        return LimitingResource(Limit.UNREAD, at, evidence,
                                f"no limit named{where}: vLLM's gauges were read {m.gauge_reads} times while requests "
                                f"were in flight, too few to show a queue or a cap (its /metrics answered too "
                                f"seldom, or the requests ended between two reads)")
    if signs.seqs_capped:
        return LimitingResource(Limit.MAX_NUM_SEQS, at, evidence,
                                f"the max_num_seqs cap{where}: {f.running_peak:g} running at the cap of "
                                f"{caps.max_num_seqs} with {waiting}, KV usage peaked at {_pct(f.kv_usage_peak)}")
    if signs.prefill_slow:
        budget = (f"max_num_batched_tokens {caps.max_num_batched_tokens}"
                  if caps.max_num_batched_tokens is not None else "max_num_batched_tokens unknown")
        late = f", p95 TTFT {f.ttft_p95_s:.2f} s" if f.ttft_p95_s is not None else ""
        return LimitingResource(Limit.TOKEN_BUDGET, at, evidence,
                                f"the per-step token budget or prefill compute{where} ({budget}): {waiting} "
                                f"with {f.running_peak:g} running ({cap}) and KV usage at "
                                f"{_pct(f.kv_usage_peak)}{late}")
    if capacity is None:
        return LimitingResource(Limit.COMPUTE, at, evidence,
                                f"compute (nothing at a cap){where}: KV usage peaked at {_pct(f.kv_usage_peak)}, "
                                f"{f.running_peak:g} running ({cap}), {waiting}")
    evidence["capacity_completed_rps"] = capacity.completed_rps
    grew = f"{capacity.completed_rps:.3g} -> {m.completed_rps:.3g} req/s completed"
    if m.completed_rps <= capacity.completed_rps * (1 + STILL_GROWING):
        return LimitingResource(Limit.COMPUTE, at, evidence,
                                f"compute{where}: nothing at a cap and throughput stopped growing with load ({grew})")
    return LimitingResource(Limit.NONE_SHOWN, at, evidence,
                            f"nothing at a cap{where}, and throughput still grew with load ({grew}): "
                            f"no limiting resource shows")


def edge_probe(judged: Sequence[JudgedProbe]) -> JudgedProbe | None:
    """The probe at which a load search's trial stops meeting its boundary: the lowest above the capacity that did
    not pass (the bracket's edge); else, every probe having passed, the highest."""
    measured = [j for j in judged if j.probe.measurement is not None]
    if not measured:
        return None
    lo = max((j.probe.factor for j in measured if j.verdict is Verdict.PASS), default=None)
    above = [j for j in measured if j.verdict is not Verdict.PASS and (lo is None or j.probe.factor > lo)]
    if above:
        return min(above, key=lambda j: j.probe.factor)
    return max(measured, key=lambda j: j.probe.factor)


def limiting_resource(judged: Sequence[JudgedProbe], measurement: Measurement | None, caps: EngineCaps, *,
                      bound: Boundary | None = None) -> LimitingResource | None:
    """The limiting resource of a trial: at its edge probe after a load search (`judged`), else at its one
    measurement (a fixed load). None when nothing was measured."""
    edge = edge_probe(judged)
    if edge is None or edge.probe.measurement is None:
        if measurement is None:
            return None
        return diagnose(measurement, caps, bound=bound)
    passed = [j for j in judged if j.verdict is Verdict.PASS and j.probe.measurement is not None
              and j.probe.factor < edge.probe.factor]
    below = max(passed, key=lambda j: j.probe.factor).probe.measurement if passed else None
    return diagnose(edge.probe.measurement, caps, bound=bound, capacity=below)
