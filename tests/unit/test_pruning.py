"""The verdict watch, without an engine: it cuts a probe only where `judge_probe` would fail the whole probe, by each
of the rules it reads (a p95 limit's share within noise or not, the completion ratio, the makespan, the pace), and
the live state a finished replay had at any moment reads back from its records."""

from __future__ import annotations

import random
from dataclasses import replace

from tuner.analysis.capacity import PERCENTILE, Verdict, judge_probe, wilson_interval
from tuner.search.pruning import BoundaryWatch, VerdictWatch
from tuner.analysis.scoring import Boundary, boundary
from tuner.workers.measure import measure
from tuner.workers.probes import Probe
from tuner.workers.replay import InFlight, LiveReplay, ReplayResult
from tuner.workers.request_record import Outcome, RequestRecord

# 2 s to a first token for 95% of requests, none of which may fail.
TTFT_ONLY = boundary("interactive", {"e2e_p95_s": None, "min_completion_ratio": 1.0})


def _ended(records: list[RequestRecord]) -> float:
    """When the replay of these requests ended: its last response (a failure is taken to end by then too)."""
    return max((r.sent_s + r.e2e_s for r in records if r.e2e_s is not None), default=1.0) + 0.5


def _verdict(records: list[RequestRecord], bound: Boundary) -> Verdict:
    """The whole probe's verdict, as a load search judges it."""
    probe = Probe(0, 1.0, 0, len(records), measure(ReplayResult(records, _ended(records), None, None)))
    return judge_probe(probe, records, bound).verdict


def _served(i: int, due_s: float, ttft_s: float, e2e_s: float, input_tokens: int = 100, tokens: int = 16,
            outcome: Outcome = Outcome.OK) -> RequestRecord:
    served = outcome in (Outcome.OK, Outcome.TRUNCATED)
    return RequestRecord(i, due_s, due_s, tokens, input_tokens, tokens if served else 0, outcome,
                         ttft_s=ttft_s, e2e_s=e2e_s if served else None,
                         itl_mean_s=(e2e_s - ttft_s) / (tokens - 1) if served and tokens > 1 else None)


def test_the_watch_reads_a_finished_replay_back_as_it_stood_at_any_moment():
    records = [_served(0, 0.0, 0.5, 2.0), _served(1, 1.0, 0.4, 3.0), _served(2, 1.5, 9.0, 9.5, outcome=Outcome.TIMEOUT),
               RequestRecord(3, 9.0, None, 16, 100, 0, Outcome.NOT_SENT)]
    live = LiveReplay.as_of(records, 1.2, ended_s=20.0)
    assert live.elapsed() == 1.2 and live.total == 4 and live.due_s == {0: 0.0, 1: 1.0, 2: 1.5, 3: 9.0}
    assert live.finished == [] and live.in_flight == {0: InFlight(0.0, 100, 0.5), 1: InFlight(1.0, 100, None)}
    later = LiveReplay.as_of(records, 4.5, ended_s=20.0)
    # The failure keeps no time of its end: in flight until the replay ended.
    assert [r.index for r in later.finished] == [0, 1] and set(later.in_flight) == {2}
    assert [r.index for r in LiveReplay.as_of(records, 20.0, ended_s=20.0).finished] == [0, 1, 2]


def _late(over: int, n: int = 100) -> list[RequestRecord]:
    """n requests a second apart, the first `over` of them 3 s to their first token, the rest 0.5 s."""
    return [_served(i, float(i), 3.0 if i < over else 0.5, 4.0 if i < over else 1.0) for i in range(n)]


def test_the_verdict_watch_cuts_where_the_share_within_a_limit_cannot_reach_095_and_not_before():
    # The fewest first tokens over 2 s, of 100 requests, that leave the share within it short of 0.95 even if every
    # other is within it: the whole probe fails there, and one fewer is no failure.
    least = next(k for k in range(100) if wilson_interval(100 - k, 100)[1] < PERCENTILE)
    assert _verdict(_late(least), TTFT_ONLY) is Verdict.FAIL
    assert _verdict(_late(least - 1), TTFT_ONLY) is Verdict.INCONCLUSIVE
    watch = VerdictWatch(TTFT_ONLY)
    # Once those requests are seen over the limit (the last of them 2 s after it left), most of the rest unsent.
    cut = watch(LiveReplay.as_of(_late(least), least + 1.5, ended_s=200.0))
    assert cut == f"{least} requests already waited over 2 s for a first token: the share within it cannot reach 0.95"
    assert watch(LiveReplay.as_of(_late(least - 1), least + 0.5, ended_s=200.0)) is None
    # The prune's quantile stops a trial far sooner: its p95 is over the limit once 6 of 100 are.
    assert BoundaryWatch(TTFT_ONLY)(LiveReplay.as_of(_late(6), 7.5, ended_s=200.0)) is not None
    assert watch(LiveReplay.as_of(_late(6), 7.5, ended_s=200.0)) is None


def test_requests_already_over_a_limit_in_flight_count_unless_the_completion_budget_lets_them_fail():
    # Of 100 requests, some in flight without a first token 3 s after they left: each ends over the limit, or fails
    # as the completion ratio allows (none, 1 of 100, or 20).
    least = next(k for k in range(100) if wilson_interval(100 - k, 100)[1] < PERCENTILE)

    def waiting(n: int) -> LiveReplay:
        return LiveReplay(origin=0.0, total=100, due_s={i: 0.0 for i in range(100)}, at_s=3.0,
                          in_flight={i: InFlight(0.0, 100) for i in range(n)})

    def cuts(live: LiveReplay, ratio: float) -> bool:
        return VerdictWatch(replace(TTFT_ONLY, min_completion_ratio=ratio))(live) is not None

    assert cuts(waiting(least), 1.0) and not cuts(waiting(least), 0.99)
    assert cuts(waiting(least + 1), 0.99) and not cuts(waiting(least + 1), 0.8)


def test_the_verdict_watch_cuts_once_too_many_requests_failed_and_past_the_makespan():
    failed = [_served(i, 0.0, 0.1, 0.2, outcome=Outcome.HTTP_ERROR) for i in range(2)]
    live = LiveReplay(origin=0.0, total=100, finished=failed, due_s={i: 0.0 for i in range(100)}, at_s=1.0)
    interactive = boundary("interactive")
    assert VerdictWatch(interactive)(live) == "2 of 100 requests already failed: the completion ratio cannot reach 0.99"
    assert VerdictWatch(replace(interactive, min_completion_ratio=0.98))(live) is None
    # The batch boundary's makespan: twice the probe's arrival window (its last request due at 50 s) and 60 s.
    batch = boundary("batch")
    live = LiveReplay(origin=0.0, total=2, due_s={0: 0.0, 1: 50.0}, at_s=160.5, in_flight={1: InFlight(50.0, 100)})
    assert VerdictWatch(batch)(live) == "the replay is past its makespan limit of 160.0 s with requests unfinished"


def _queue(n: int, gap_s: float, service_s: float) -> list[RequestRecord]:
    """n requests `gap_s` apart served one at a time, each `service_s`: a queue that grows when service_s > gap_s."""
    records, free_at = [], 0.0
    for i in range(n):
        free_at = max(free_at, i * gap_s) + service_s
        e2e = free_at - i * gap_s
        records.append(_served(i, i * gap_s, e2e - service_s + 0.01, e2e))
    return records


def test_the_verdict_watch_cuts_a_queue_that_grows_once_a_pace_rule_is_decided():
    lifted = boundary("interactive", {"ttft_p95_s": None, "e2e_p95_s": None})
    records = _queue(60, 0.1, 0.3)  # three times what the engine serves: the last answer 18 s, arrivals over 5.9 s
    assert _verdict(records, lifted) is Verdict.FAIL
    watch = VerdictWatch(lifted)
    cuts = [(t, watch(LiveReplay.as_of(records, t, _ended(records)))) for t in (x / 4 for x in range(1, 72))]
    t, reason = next((t, reason) for t, reason in cuts if reason is not None)
    assert reason.startswith("did not keep up: of 40 requests due in the last two thirds")
    # Decided once the arrivals and the early requests' p90 latency had passed, 12 s before the last answer.
    pace = measure(ReplayResult(records, _ended(records), None, None)).pace
    assert pace.window_s + pace.lag_s < t <= pace.window_s + pace.lag_s + 0.25 < _ended(records) - 5
    # The drain rule, where most later requests are not late but the tail is: the window's later requests served in
    # time, and the last ten far beyond (a rule the watch decides once one of them must come after it allows).
    tail = [_served(i, i * 0.1, 0.05, 0.2 if i < 50 else 20.0) for i in range(60)]
    assert _verdict(tail, lifted) is Verdict.FAIL
    reasons = [watch(LiveReplay.as_of(tail, t, _ended(tail))) for t in (x / 4 for x in range(1, 100))]
    assert next(r for r in reasons if r is not None).startswith("did not keep up: the last response came")


def _random_probe(rng: random.Random) -> tuple[list[RequestRecord], Boundary]:
    """A probe of random size, load and failures, with a boundary that holds it to random limits of every kind."""
    n = rng.randint(8, 150)
    gap = rng.uniform(0.02, 0.4)
    service = rng.uniform(0.1, 2.0)
    growth = rng.choice([0.0, rng.uniform(0.005, 0.2)])  # added per request: a queue that grows
    stalled = n - rng.choice([0, 0, rng.randint(1, 5)])  # from here on, requests wait for a stall: a long drain
    records = []
    for i in range(n):
        e2e = service * rng.uniform(0.3, 1.7) + growth * i + (rng.uniform(1, 3) * n * gap if i >= stalled else 0)
        outcome = rng.choices([Outcome.OK, Outcome.TRUNCATED, Outcome.HTTP_ERROR, Outcome.TIMEOUT],
                              [92, 2, 4, 2])[0]
        record = _served(i, i * gap, e2e * rng.uniform(0.02, 0.7), e2e, input_tokens=rng.choice([200, 3000, 12000]),
                         tokens=rng.choice([1, 2, 30]), outcome=outcome)
        records.append(replace(record, sent_s=i * gap + rng.uniform(0.0, 0.01)))
    # Each limit lifted more often than not, so that the pace rules too decide some probes.
    bound = Boundary("random", ttft_p95_s=rng.choice([None, None, rng.uniform(0.05, 2.0)]),
                     e2e_p95_s=rng.choice([None, None, rng.uniform(0.3, 6.0)]),
                     min_completion_ratio=rng.choice([0.8, 0.9, 0.99, 1.0]),
                     makespan_factor=rng.choice([None, None, rng.uniform(1.0, 2.0)]),
                     makespan_grace_s=rng.uniform(0, 2),
                     tpot_p95_s=rng.choice([None, None, rng.uniform(0.005, 0.05)]),
                     ttft_per_1k_prompt_p95_s=rng.choice([None, None, rng.uniform(0.02, 0.5)]))
    return records, bound


def test_the_verdict_watch_never_cuts_a_probe_whose_whole_run_would_not_fail():
    """Property: wherever the watch cuts, on random probes at any moment of their replay, `judge_probe` fails the
    whole probe; and it cuts most that fail, by every rule it reads."""
    rng = random.Random(35)
    failing = cut = 0
    kinds: set[str] = set()
    for _ in range(300):
        records, bound = _random_probe(rng)
        verdict, ended = _verdict(records, bound), _ended(records)
        watch = VerdictWatch(bound)
        reason = next((reason for t in (ended * x / 40 for x in range(1, 40))
                       if (reason := watch(LiveReplay.as_of(records, t, ended))) is not None), None)
        failing += verdict is Verdict.FAIL
        if reason is not None:
            assert verdict is Verdict.FAIL, (reason, verdict)
            cut += 1
            kinds.add(next(kind for kind in ("first token", "end to end", "per output token", "completion ratio",
                                             "makespan", "last response", "two thirds") if kind in reason))
    assert cut > 0.5 * failing > 50, (cut, failing)
    assert kinds == {"first token", "end to end", "per output token", "completion ratio", "makespan",
                     "last response", "two thirds"}, kinds
