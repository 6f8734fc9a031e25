"""The most traffic a KV cache can carry (tuner.search.kv_traffic), and the runner that launches no configuration below
the best so far by it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factories import MACHINE, measurement, request_records
from tuner.analysis.capacity import LoadPolicy
from tuner.cli.present import summary_line
from tuner.analysis.kv_budget import KvEstimate
from tuner.search.kv_traffic import PROBE_OVERLOAD_ALLOWED, kv_traffic_bound, tpot_floor
from tuner.common.paths import bundled_trace
from tuner.analysis.scoring import Capacity, Rejection, Score
from tuner.storage import StoredTrial, TrialState
from tuner.study.create import create_study, enqueue_config
from tuner.study.events import TrialSummary
from tuner.study.plan import StoragePlan
from tuner.study.runner import StudyRunner
from tuner.traces.records import PREFIX_BLOCK_TOKENS, Trace, TraceRequest
from tuner.traces.selection import TraceSelection, fit_trace
from tuner.workers.engine_config import EngineConfig
from tuner.workers.measure import Measurement, measure
from tuner.workers.replay import ReplayResult


def _estimate(tokens: int, error: float = 0.0) -> KvEstimate:
    return KvEstimate(tokens, tokens * 2048, "num_gpu_blocks_override", error, tokens)


def _trace(*requests: TraceRequest) -> Trace:
    return Trace("hand-made", "native", "0" * 64, requests)


def test_the_bound_is_the_kv_cache_over_what_a_request_holds_through_its_decode():
    # Decode steps hold prompt + 1 .. prompt + output - 1 tokens: 10 x (100 + 5.5) = 1,055 token-steps for the
    # first request, 20 x (300 + 10.5) = 6,210 for the second; 3,632.5 on average, 72.65 token-seconds at 20 ms a
    # step. The cache holds at most 1,000 x 1.05 tokens: 1,050 / 72.65 = 14.45 req/s by Little's law, 18.07 with
    # the allowance for a probe passing an engine somewhat overloaded.
    trace = _trace(TraceRequest(0.0, 100, 11), TraceRequest(1.0, 300, 21))
    bound = kv_traffic_bound(_estimate(1000, error=0.05), trace, 0.02, EngineConfig())
    assert bound is not None
    assert bound.token_seconds == pytest.approx(72.65)
    assert bound.rps == pytest.approx(PROBE_OVERLOAD_ALLOWED * 1050 / 72.65) == pytest.approx(18.066, abs=1e-3)
    assert bound.reason(20.0) == ("at most 18.1 req/s by its KV cache (estimate 1,000 tokens), below the best so "
                                  "far, 20 req/s")


def test_prefix_blocks_count_as_held_by_no_one_unless_prefix_caching_is_off():
    # 600 prompt tokens, 512 of them in a prefix block that other requests in flight may share.
    trace = _trace(TraceRequest(0.0, 600, 11, prefix_blocks=(7,)))
    shared = kv_traffic_bound(_estimate(1000), trace, 0.01, EngineConfig())
    own = kv_traffic_bound(_estimate(1000), trace, 0.01, EngineConfig(enable_prefix_caching=False))
    assert shared is not None and own is not None
    assert shared.token_seconds == pytest.approx(10 * (600 - PREFIX_BLOCK_TOKENS + 5.5) * 0.01)
    assert own.token_seconds == pytest.approx(10 * (600 + 5.5) * 0.01)


def test_no_decode_step_gives_no_bound():
    assert kv_traffic_bound(_estimate(1000), _trace(TraceRequest(0.0, 500, 1)), 0.01, EngineConfig()) is None


def test_the_floor_is_the_fastest_token_measured_on_an_engine_that_steps_the_same_way():
    eager = EngineConfig(enforce_eager=True, max_num_seqs=8)
    measured = [(eager, measurement(tpot_fastest_s=0.03)), (replace(eager, max_num_seqs=64), measurement(
        tpot_fastest_s=0.02)), (EngineConfig(enforce_eager=True, quantization="fp8"), measurement(
            tpot_fastest_s=0.005)), (eager, measurement())]
    # max_num_seqs does not change what a step costs; FP8 weights do, so their faster tokens are no floor here.
    assert tpot_floor(measured, replace(eager, max_num_seqs=2)) == 0.02
    assert tpot_floor(measured, EngineConfig(enforce_eager=True, quantization="fp8")) == 0.005
    assert tpot_floor(measured, EngineConfig()) is None


def test_a_measurement_keeps_its_fastest_requests_decode_time_per_token():
    # The factory's requests: 16 tokens each, the first at 0.05 s, the last at 0.4 s: 0.35 s over 15 tokens.
    m = measure(ReplayResult(request_records(5), 3.0, None, None))
    assert m.tpot_fastest_s == pytest.approx(0.35 / 15)
    assert Measurement.from_dict(m.to_dict()).tpot_fastest_s == m.tpot_fastest_s
    older = {k: v for k, v in m.to_dict().items() if k != "tpot_fastest_s"}
    assert Measurement.from_dict(older).tpot_fastest_s is None


# --- the runner ------------------------------------------------------------------------------------------------

SMALL_KV = EngineConfig(max_num_seqs=4, max_num_batched_tokens=1024, num_gpu_blocks_override=12)
LARGE_KV = replace(SMALL_KV, num_gpu_blocks_override=96)


@pytest.fixture
def runner(tiny_model, tmp_path) -> StudyRunner:
    """A load search on the tiny model (the cpu-small space, eight requests of the bundled trace), nothing run."""
    plan = StoragePlan.resolve(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    create_study("s", model=tiny_model, trace_path=bundled_trace(), space="cpu-small", boundary_name="interactive",
                 limits={}, plan=plan, load=LoadPolicy(), selection=TraceSelection(max_requests=8, fit="clip"))
    return StudyRunner("s", plan)


def _small_kv_bound(runner: StudyRunner, tpot_s: float) -> float:
    """What the 12 blocks of SMALL_KV carry of the study's trace, at `tpot_s` a token."""
    trace = fit_trace(runner.opened.ctx.trace, runner.opened.ctx.selection, 1024)
    bound = kv_traffic_bound(_estimate(12 * 128), trace, tpot_s, SMALL_KV)
    assert bound is not None
    return bound.rps


def _baseline_measured(runner: StudyRunner, carried_rps: float, tpot_s: float | None) -> None:
    """The study's baseline stored as run: it carried `carried_rps`, its fastest token `tpot_s`."""
    trial = runner.opened.study.ask()
    config = runner.opened.ctx.space.baseline()
    capacity = Capacity(carried_rps, 1.0, 1.0, None, 1, "probes ran out")
    runner.opened.repo.save_trial(StoredTrial(
        study_name="s", trial_number=trial.number, attempt=1, state=TrialState.COMPLETE, engine_config=config,
        serve_command=config.serve_command("tiny"), measurement=measurement(tpot_fastest_s=tpot_s),
        failure_class=None, failure_message=None, log_excerpt=None, estimated_max_model_len=None, exit_code=None,
        timings=None, hardware=MACHINE, vllm_version="0.32.0", started_at="2025-05-01T10:00:00+00:00",
        finished_at="2025-05-01T10:05:00+00:00",
        score=Score(carried_rps, 1.0, 100.0, 1.0, {}, [], capacity)), [])
    runner.opened.study.tell(trial, [carried_rps, 1.0])


def _start(runner: StudyRunner, config: EngineConfig) -> TrialSummary | None:
    """`config` asked of the runner: the summary of its rejection before launch, or None when it would launch."""
    enqueue_config("s", runner.opened.plan, config)
    job = runner.launches.start(0)
    if isinstance(job, TrialSummary):
        return job
    job[0].beat.stop()
    return None


def test_a_configuration_whose_kv_cache_cannot_carry_the_best_so_far_is_not_launched(runner):
    best = 2 * _small_kv_bound(runner, 0.004)
    _baseline_measured(runner, best, tpot_s=0.004)
    skipped = _start(runner, SMALL_KV)
    assert skipped is not None and skipped.state is TrialState.INFEASIBLE
    assert skipped.reason == (f"at most {best / 2:.3g} req/s by its KV cache (estimate 1,536 tokens), below the "
                              f"best so far, {best:.3g} req/s")
    assert summary_line(skipped) == f"trial {skipped.number}: infeasible: {skipped.reason}"  # the run's progress
    stored = {t.trial_number: t for t in runner.opened.repo.trials("s")}[skipped.number]
    assert stored.timings is None and isinstance(stored.score, Rejection)
    assert stored.score.violations == [skipped.reason]
    assert not (runner.opened.plan.artifact_dir / "trials" / "s" / f"trial-{skipped.number:04d}").exists()
    # Eight times the blocks carry four times the best: launched.
    assert _start(runner, LARGE_KV) is None


def test_nothing_is_skipped_before_a_per_token_time_was_measured(runner):
    # The baseline carried far more than 12 blocks could, but no request's time per token is known.
    _baseline_measured(runner, 1000.0, tpot_s=None)
    assert _start(runner, SMALL_KV) is None
