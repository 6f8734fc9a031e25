"""The samplers: the bottleneck sampler's diagnosis and moves on vLLM's own figures, and per-trial seeding.

Real Optuna studies in memory; each trial is told figures of the kind a real trial leaves (measurement_attrs)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from tuner.search.bottleneck import RELIEF_ATTR, Diagnosis, raised, relief_move
from tuner.common.errors import TunerError
from tuner.search.samplers import DEFAULT_SAMPLER, SAMPLERS, make_sampler
from tuner.studies import StudyRequest

SPACE = {
    "max_num_seqs": IntDistribution(2, 64, log=True),
    "gpu_memory_utilization": FloatDistribution(0.2, 0.9, step=0.05),
    "max_num_batched_tokens": CategoricalDistribution([256, 1024, 4096]),
}
CALM = {"preemptions": 0, "kv_usage_peak": 0.3, "waiting_peak": 0.0, "running_peak": 3.0}


def _study(sampler: str = "bottleneck", seed: int | None = 0) -> optuna.Study:
    return optuna.create_study(directions=["maximize", "minimize"], sampler=make_sampler(sampler, seed))


def _tell(study: optuna.Study, params: dict, rps: float, figures: dict, ttft_over: float = -1.0,
          state: TrialState = TrialState.COMPLETE, ttft_limit: str = "ttft_p95_s") -> None:
    """A finished trial with these parameters, its objectives, its TTFT constraint (`ttft_limit`) and vLLM's
    figures."""
    study.add_trial(optuna.trial.create_trial(
        state=state, values=[rps, 1.0] if state == TrialState.COMPLETE else None, params=params,
        distributions={name: SPACE[name] for name in params}, user_attrs=figures,
        constraints={ttft_limit: ttft_over} if state == TrialState.COMPLETE else None))


def _suggest(study: optuna.Study) -> tuple[dict, str | None]:
    trial = study.ask()
    params = {"max_num_seqs": trial.suggest_int("max_num_seqs", 2, 64, log=True),
              "gpu_memory_utilization": trial.suggest_float("gpu_memory_utilization", 0.2, 0.9, step=0.05),
              "max_num_batched_tokens": trial.suggest_categorical("max_num_batched_tokens", [256, 1024, 4096])}
    study.tell(trial, [0.0, 1.0])
    return params, study.trials[-1].user_attrs.get(RELIEF_ATTR)


def test_raised_moves_halfway_up_on_the_distributions_grid():
    assert raised(4, SPACE["max_num_seqs"]) == 16  # geometric midpoint of 4 and 64
    assert raised(32, SPACE["max_num_seqs"]) == 46
    assert raised(64, SPACE["max_num_seqs"]) is None
    assert raised(0.2, SPACE["gpu_memory_utilization"]) == 0.55
    assert raised(0.85, SPACE["gpu_memory_utilization"]) == 0.9  # at least one step
    assert raised(0.9, SPACE["gpu_memory_utilization"]) is None
    assert raised(256, SPACE["max_num_batched_tokens"]) == 1024  # the next larger choice
    assert raised(4096, SPACE["max_num_batched_tokens"]) is None
    assert raised(True, CategoricalDistribution([True, False])) is None  # not an ordered setting


def test_diagnosis_reads_preemptions_the_sequence_cap_and_late_first_tokens():
    study = _study()
    cases = [
        ({"preemptions": 3, "kv_usage_peak": 0.6, "waiting_peak": 5.0, "running_peak": 4.0}, -1.0,
         ("gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override")),
        ({"preemptions": 0, "kv_usage_peak": 0.97, "waiting_peak": 0.0, "running_peak": 4.0}, -1.0,
         ("gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override")),
        ({"preemptions": 0, "kv_usage_peak": 0.5, "waiting_peak": 7.0, "running_peak": 4.0}, -1.0,
         ("max_num_seqs",)),
        ({"preemptions": 0, "kv_usage_peak": 0.5, "waiting_peak": 7.0, "running_peak": 2.0}, -1.0,
         ("max_num_batched_tokens",)),
        ({"preemptions": 0, "kv_usage_peak": 0.5, "waiting_peak": 0.0, "running_peak": 2.0}, 0.8,
         ("max_num_batched_tokens",)),
        # Waiting that vLLM's queue-time histogram puts under 0.5 s at p95 is no queue worth relieving.
        ({"preemptions": 0, "kv_usage_peak": 0.5, "waiting_peak": 6.0, "running_peak": 4.0, "queue_p95_s": 0.29},
         -1.0, ()),
        ({"preemptions": 0, "kv_usage_peak": 0.5, "waiting_peak": 33.0, "running_peak": 4.0, "queue_p95_s": 1.2},
         -1.0, ("max_num_seqs",)),
        (CALM, -1.0, ()),
    ]
    for figures, ttft_over, expected in cases:
        _tell(study, {"max_num_seqs": 4, "gpu_memory_utilization": 0.5, "max_num_batched_tokens": 256}, 1.0,
              figures, ttft_over)
        assert Diagnosis.of(study.trials[-1]).settings() == expected, figures
    # First tokens late against the long-prompt boundary's limit per 1,000 prompt tokens: the same sign.
    _tell(study, {"max_num_seqs": 4, "gpu_memory_utilization": 0.5, "max_num_batched_tokens": 256}, 1.0, CALM, 0.3,
          ttft_limit="ttft_per_1k_prompt_p95_s")
    assert Diagnosis.of(study.trials[-1]).settings() == ("max_num_batched_tokens",)


def test_relief_moves_the_best_trial_and_never_repeats_a_configuration():
    study = _study()
    # The best trial preempted with its sequence slots full: the KV budget goes up (not max_num_seqs).
    _tell(study, {"max_num_seqs": 8, "gpu_memory_utilization": 0.3, "max_num_batched_tokens": 1024}, 5.0,
          {"preemptions": 4, "kv_usage_peak": 1.0, "waiting_peak": 3.0, "running_peak": 8.0})
    _tell(study, {"max_num_seqs": 2, "gpu_memory_utilization": 0.9, "max_num_batched_tokens": 256}, 2.0, CALM)
    params, note = _suggest(study)
    assert params == {"max_num_seqs": 8, "gpu_memory_utilization": 0.6, "max_num_batched_tokens": 1024}
    assert note == "trial 0: move gpu_memory_utilization 0.3 -> 0.6"
    # That move is taken now (the trial above), so the same figures give no move from trial 0 again.
    move = relief_move(study.trials, SPACE)
    assert move is None or move.params != params


# A space of a study that allows FP8: the precision levers are offered beside the scheduler's settings.
FP8_SPACE = {**SPACE, "kv_cache_dtype": CategoricalDistribution(["auto", "fp8"]),
             "quantization": CategoricalDistribution([None, "fp8"])}


@pytest.mark.parametrize("figures, ttft_over, expected", [
    # The KV cache short: FP8 KV beside a larger budget.
    ({"preemptions": 4, "kv_usage_peak": 1.0, "waiting_peak": 3.0, "running_peak": 8.0}, -1.0,
     {"gpu_memory_utilization": 0.6, "kv_cache_dtype": "fp8", "quantization": None}),
    # First tokens late with slots free (prefill compute): FP8 weights beside a larger token budget.
    ({"preemptions": 0, "kv_usage_peak": 0.4, "waiting_peak": 0.0, "running_peak": 3.0}, 0.8,
     {"gpu_memory_utilization": 0.3, "kv_cache_dtype": "auto", "quantization": "fp8",
      "max_num_batched_tokens": 4096}),
])
def test_relief_pulls_the_precision_lever_that_fits_the_limit_read(figures, ttft_over, expected):
    study = optuna.create_study(directions=["maximize", "minimize"])
    params = {"max_num_seqs": 8, "gpu_memory_utilization": 0.3, "max_num_batched_tokens": 1024,
              "kv_cache_dtype": "auto", "quantization": None}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.COMPLETE, values=[5.0, 1.0], params=params, distributions=FP8_SPACE, user_attrs=figures,
        constraints={"ttft_p95_s": ttft_over}))
    move = relief_move(study.trials, FP8_SPACE)
    assert move is not None and move.params == {**params, **expected}, move
    # Without FP8 in the space (a study that does not allow it), no lever is pulled.
    plain = relief_move(study.trials, {**SPACE, "kv_cache_dtype": CategoricalDistribution(["auto"]),
                                       "quantization": CategoricalDistribution([None])})
    assert plain is None or ("fp8" not in plain.params.values()), plain


def test_calm_trials_leave_the_proposal_to_tpe():
    study = _study()
    _tell(study, {"max_num_seqs": 8, "gpu_memory_utilization": 0.5, "max_num_batched_tokens": 1024}, 5.0, CALM)
    _params, note = _suggest(study)
    assert note is None
    assert relief_move(study.trials, SPACE) is None


def test_a_trial_stopped_early_is_diagnosed_after_the_measured_ones():
    study = _study()
    _tell(study, {"max_num_seqs": 16, "gpu_memory_utilization": 0.2, "max_num_batched_tokens": 256}, 0.0,
          {"preemptions": 9, "kv_usage_peak": 1.0, "waiting_peak": 12.0, "running_peak": 6.0},
          state=TrialState.PRUNED)
    move = relief_move(study.trials, SPACE)
    assert move is not None and move.params["gpu_memory_utilization"] == 0.55


def test_seeding_is_per_trial_number():
    """The same seed and trial number propose the same; a second driver (other numbers) proposes otherwise."""
    def proposals(study: optuna.Study, n: int) -> list[dict]:
        return [_suggest(study)[0] for _ in range(n)]

    first = proposals(_study("tpe", seed=7), 4)
    assert proposals(_study("tpe", seed=7), 4) == first
    # Two drivers sharing one study with the same seed: trial numbers interleave, proposals differ.
    shared = optuna.create_study(directions=["maximize", "minimize"])
    a, b = make_sampler("random", 7), make_sampler("random", 7)
    seen = []
    for sampler in (a, b, a, b):
        shared.sampler = sampler
        seen.append(_suggest(shared)[0])
    assert len({tuple(sorted(p.items())) for p in seen}) == 4


def test_sampler_names_and_default():
    assert DEFAULT_SAMPLER == "bottleneck" == StudyRequest.model_fields["sampler"].default
    assert set(SAMPLERS) == {"bottleneck", "tpe", "random", "nsga2"}
    with pytest.raises(TunerError, match="unknown sampler 'grid'"):
        make_sampler("grid", None)
