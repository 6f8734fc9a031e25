"""The threads tuner gives a vLLM engine on the CPU build: its worker inside the engine core, on half the usable
cores, unless the user set any of vLLM's thread variables (then vLLM's own behaviour, whole)."""

from __future__ import annotations

import pytest

from tuner.common.hardware import detect_hardware
from tuner.workers.cpu_engine import LAYOUT_VARS, cpu_engine_env, cpu_engine_threads, usable_cores


def test_half_the_cores_at_least_one():
    assert [cpu_engine_threads(n) for n in (1, 2, 3, 8, 64)] == [1, 1, 1, 4, 32]


def test_a_cpu_engine_runs_its_worker_in_process_on_half_the_usable_cores():
    assert detect_hardware().accelerator == "cpu"  # these machines have no GPU
    assert cpu_engine_env({"PATH": "/usr/bin"}) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                                    "OMP_NUM_THREADS": str(max(1, usable_cores() // 2))}


@pytest.mark.parametrize("var", LAYOUT_VARS)
def test_vllms_own_layout_chosen_by_the_user_is_left_whole(var):
    assert cpu_engine_env({var: "1"}) == {}


def test_an_openmp_count_alone_is_no_choice_of_layout_ray_sets_one_in_every_worker():
    # Studies launch their engines inside Ray's workers, whose environment Ray gives OMP_NUM_THREADS (the first form
    # took it for the user's choice, and every study's engine ran as vLLM starts itself).
    assert cpu_engine_env({"OMP_NUM_THREADS": "1"}) == cpu_engine_env({})


def test_a_cpu_slot_runs_its_engine_in_process_on_half_its_share_unbound():
    from tuner.workers.pool import _cpu_share_env

    assert cpu_engine_env({}, cores=8) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "4"}
    share = max(1, usable_cores() // 2)
    assert _cpu_share_env((1, 2)) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                      "OMP_NUM_THREADS": str(cpu_engine_threads(share))}
    assert "VLLM_CPU_OMP_THREADS_BIND" not in _cpu_share_env((0, 2))  # no pin: the kernel places the threads
