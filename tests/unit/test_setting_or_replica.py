"""The seed's question, from a configuration's limiting resource and the room its space leaves: a setting within the
space, or another replica."""

from __future__ import annotations

from pathlib import Path

from factories import scored_trial
from tuner.analysis.diagnosis import Limit, LimitingResource
from tuner.search_spaces.loading import parse_space
from tuner.study.capacity_plan import remedy, space_highest
from tuner.workers.engine_config import EngineConfig

SPACE = parse_space("name: s\nfixed: {gpu_memory_utilization: 0.9}\nparameters:\n"
                    "  max_num_seqs: {type: int, low: 8, high: 256}\n"
                    "  max_num_batched_tokens: {type: categorical, choices: [null, 2048, 8192]}\n", Path("s.yaml"))


def _limit(kind: Limit, **evidence) -> LimitingResource:
    return LimitingResource(kind, 12.0, {"waiting_peak": 0.0, **evidence}, "")


def test_the_highest_value_a_space_allows_a_setting():
    assert space_highest(SPACE, "max_num_seqs") == 256
    assert space_highest(SPACE, "max_num_batched_tokens") == 8192  # null is vLLM's own default
    assert space_highest(SPACE, "gpu_memory_utilization") == 0.9  # fixed
    assert space_highest(SPACE, "block_size") is None


def test_a_cap_the_space_can_still_raise_is_a_setting():
    trial = scored_trial(1, 3.0, config=EngineConfig(max_num_seqs=64))
    text = remedy(_limit(Limit.MAX_NUM_SEQS, max_num_seqs=64, waiting_peak=7.0), trial, SPACE)
    assert text == ("its queue grew (7 waiting at 12 req/s); a setting: raise max_num_seqs (now 64; the space allows "
                    "up to 256)")


def test_a_cap_at_the_spaces_top_or_one_it_does_not_search_is_another_replica():
    trial = scored_trial(1, 3.0, config=EngineConfig(max_num_batched_tokens=8192))
    assert remedy(_limit(Limit.TOKEN_BUDGET, max_num_batched_tokens=8192), trial, SPACE) == (
        "another replica: max_num_batched_tokens holds it back and is at the space's top (8192)")
    # The KV cache: gpu_memory_utilization is fixed at 0.9, vLLM's default, so the space has no more room.
    assert remedy(_limit(Limit.KV_CACHE), trial, SPACE) == (
        "another replica: gpu_memory_utilization holds it back and is at the space's top (0.9)")
    no_room = parse_space("name: s\nparameters:\n  block_size: {type: categorical, choices: [16, 32]}\n",
                          Path("s.yaml"))
    assert remedy(_limit(Limit.MAX_NUM_SEQS, max_num_seqs=256), trial, no_room) == (
        "another replica within this space: max_num_seqs holds it back and the space does not search it")


def test_compute_is_another_replica_and_no_sign_supports_neither():
    trial = scored_trial(1, 3.0)
    assert remedy(_limit(Limit.COMPUTE), trial, SPACE) == (
        "another replica: the engine itself is the limit (compute, nothing at a cap)")
    assert remedy(_limit(Limit.NONE_SHOWN), trial, SPACE) == (
        "neither is supported yet: nothing was at a cap and throughput still grew with load")
    assert remedy(_limit(Limit.UNREAD), trial, SPACE) == (
        "neither is supported yet: vLLM's gauges were read too seldom to name a limit")
    assert remedy(None, trial, SPACE).startswith("no limit measured")
