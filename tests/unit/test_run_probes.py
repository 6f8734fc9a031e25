"""run_probes between probes, without vLLM: the plan is asked once for each next load, and nothing is replayed
against an engine that died before the probe it asked for, nor warmed up once earlier probes settled the plan."""

from __future__ import annotations

from dataclasses import dataclass, field

from factories import measurement
from tuner.traces.records import Trace, TraceRequest
from tuner.workers.probes import Probe, ProbeRun, run_probes

TRACE = Trace("synthetic", "native", "0" * 64, (TraceRequest(0.0, 16, 8),))


@dataclass
class Engine:
    """An engine as run_probes sees it, at an address nothing answers: a warm-up or probe would show in the phases."""

    live: bool = True
    base_url: str = "http://127.0.0.1:9"

    def alive(self) -> bool:
        return self.live


@dataclass
class Plan:
    """Asks for a second probe after the first, killing `engine` as it does so when `kill` is set."""

    engine: Engine
    kill: bool
    warmup_requests: int = 4
    min_requests: int = 0
    min_span_s: float = 0.0
    asked: list[int] = field(default_factory=list)

    def next_factor(self, runs) -> float | None:
        self.asked.append(len(runs))
        if len(runs) == 1 and self.kill:
            self.engine.live = False
            return 2.0
        return None if runs else 1.0


def _earlier() -> list[ProbeRun]:
    return [ProbeRun(Probe(0, 1.0, 7, 16, measurement()))]


def _phases(plan: Plan, engine: Engine) -> tuple[list[ProbeRun], list[str]]:
    phases: list[str] = []
    runs = run_probes(engine, TRACE, 1024, plan, seed=0, request_timeout_s=1.0, earlier=_earlier(),
                      on_phase=phases.append)
    return runs, phases


def test_an_engine_dead_before_the_probe_the_plan_asked_for_gets_no_probe():
    engine = Engine()
    plan = Plan(engine, kill=True)
    runs, phases = _phases(plan, engine)
    assert [run.probe.index for run in runs] == [0] and phases == []
    assert plan.asked == [1], "asked once, for the probe after the earlier one"


def test_earlier_probes_that_settle_the_plan_are_neither_warmed_up_for_nor_added_to():
    engine = Engine()
    plan = Plan(engine, kill=False)
    runs, phases = _phases(plan, engine)
    assert [run.probe.index for run in runs] == [0] and phases == [] and plan.asked == [1]
