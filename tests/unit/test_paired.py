"""The paired validation's pieces that need no engine: the arms' order in each round, a load plan run one probe at a
time, and whether the installed vLLM serves the sleep endpoints (read from its files, as the driver decides
without launching anything)."""

from __future__ import annotations

from dataclasses import dataclass, field

from factories import measurement
from tuner.workers.paired import OneStep, declares_sleep_route, round_order, sleep_mode_served
from tuner.workers.probes import Probe, ProbeRun


def test_the_arms_take_turns_in_order_in_odd_rounds_and_reversed_in_even_ones():
    assert [round_order(2, r) for r in (1, 2, 3, 4)] == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert round_order(3, 2) == [2, 1, 0]


@dataclass
class Plan:
    """Asks for 1, 2, 4 and then no more, and records each question."""

    warmup_requests: int = 8
    min_requests: int = 80
    min_span_s: float = 20.0
    asked: list[int] = field(default_factory=list)

    def next_factor(self, runs) -> float | None:
        self.asked.append(len(runs))
        return [1.0, 2.0, 4.0, None][len(runs)]


def _runs(n: int) -> list[ProbeRun]:
    return [ProbeRun(Probe(i, 2.0 ** i, i, 80, measurement())) for i in range(n)]


def test_a_plan_run_one_step_at_a_time_asks_for_its_next_load_once():
    plan = Plan()
    step = OneStep(plan, done=1)
    assert (step.warmup_requests, step.min_requests, step.min_span_s) == (8, 80, 20.0)
    assert step.next_factor(_runs(1)) == 2.0, "the plan's next load after the probes it had"
    assert step.next_factor(_runs(2)) is None, "then none: the other arm's turn"
    assert plan.asked == [1]
    assert OneStep(plan, done=3).next_factor(_runs(3)) is None, "a plan that asks for no more is done"


def test_the_sleep_endpoints_are_found_in_vllms_files(tmp_path):
    # vLLM 0.24's route, as declared in vllm/entrypoints/serve/dev/sleep/api_router.py.
    routed = tmp_path / "new" / "entrypoints" / "serve" / "dev" / "sleep"
    routed.mkdir(parents=True)
    (routed / "api_router.py").write_text('@router.post("/sleep")\nasync def sleep(raw_request): ...\n')
    bare = tmp_path / "old" / "entrypoints" / "openai"
    bare.mkdir(parents=True)
    (bare / "api_server.py").write_text("# no sleep mode here: asyncio.sleep(1)\n")
    assert declares_sleep_route([tmp_path / "new"]) and not declares_sleep_route([tmp_path / "old"])
    # The CPU build installed here declares them too: what keeps it unpaired is its platform, not its routes.
    assert sleep_mode_served()
