"""The limiting resource on real vLLM (CPU build, tiny model): a tight KV budget, a sequence cap of 2 and a small
per-step token budget, each named from vLLM's own figures at a load certain to queue.

Three launches, one per case, each one replay at a fixed load with the latency limits lifted: the bundled
trace's first requests at 100 times their rate, all due within a moment of each other."""

from __future__ import annotations

import json

import pytest

from conftest import FIXED_LOAD, NO_LATENCY_LIMIT_ARGS, run_tuner

pytestmark = pytest.mark.vllm

ENGINE = ["--set", "max_model_len=1024", "--set", "enforce_eager=true", "--set", "kv_cache_memory_bytes=268435456"]
# Each case names its limit only from vLLM's gauges read at least four times while its requests are in flight
# (tuner/analysis/diagnosis.py). With one core kept busy, 32 requests with 12 KV blocks gave 4 reads and 2 sequence
# slots 7; a crowded CI machine answered /metrics once in the 6.6 s of 64 requests on the token budget. More requests
# last longer, at no cost to the case each shows.
CASES = {
    # 12 blocks of 128 tokens for 48 requests at once: the cache fills and requests are preempted.
    "kv_cache": (48, ["--set", "num_gpu_blocks_override=12"]),
    # Two sequences at a time, a large cache: the rest wait for a slot.
    "max_num_seqs": (32, ["--set", "max_num_seqs=2"]),
    # 128 tokens a step (chunked prefill on; vLLM's CPU default of 128 sequences, a large cache): prompts of a few
    # hundred tokens each are admitted a chunk at a time while slots and cache stay free. 120 of them, fewer than the
    # slots, so that a queue is the token budget's: 32 were all served within a second on an idle machine, between
    # two reads of vLLM's gauges.
    "max_num_batched_tokens": (120, ["--set", "max_num_batched_tokens=128", "--set", "enable_chunked_prefill=true"]),
}


@pytest.fixture(scope="module")
def diagnosed(tiny_model, tmp_path_factory) -> dict[str, dict]:
    found = {}
    for name, (requests, settings) in CASES.items():
        out = tmp_path_factory.mktemp(f"diagnosis-{name}")
        result = run_tuner("trial", "run", "--model", str(tiny_model), "--max-requests", str(requests),
                           "--rate-scale", "100", "--fit", "clip", *ENGINE, *settings, *FIXED_LOAD,
                           *NO_LATENCY_LIMIT_ARGS, "--out", str(out), "--json")
        found[name] = json.loads(result.stdout)["limiting_resource"]
        print(f"\n{name}: {json.dumps(found[name])}")
    return found


def test_a_tight_kv_budget_with_preemptions_is_kv_bound(diagnosed):
    kv = diagnosed["kv_cache"]
    assert kv["kind"] == "kv_cache", kv
    assert kv["evidence"]["preemptions"] > 0, kv


def test_two_sequence_slots_with_a_queue_are_the_max_num_seqs_cap(diagnosed):
    seqs = diagnosed["max_num_seqs"]
    assert seqs["kind"] == "max_num_seqs", seqs
    assert seqs["evidence"]["running_peak"] == 2 and seqs["evidence"]["waiting_peak"] > 0, seqs
    assert seqs["evidence"]["max_num_seqs"] == 2


def test_a_small_token_budget_with_slots_free_is_the_token_budget(diagnosed):
    budget = diagnosed["max_num_batched_tokens"]
    assert budget["kind"] == "max_num_batched_tokens", budget
    evidence = budget["evidence"]
    assert evidence["max_num_batched_tokens"] == 128 and evidence["max_num_seqs"] == 128  # vLLM's CPU default
    assert evidence["running_peak"] < evidence["max_num_seqs"] and evidence["waiting_peak"] > 0, budget
