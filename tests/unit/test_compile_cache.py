"""The compile cache: kept in one folder per node unless the user chose one, and read back from vLLM's log as
warm, cold or unused."""

from __future__ import annotations

import pytest

from tuner.workers.compile_cache import (CompileCache, compile_cache_state, engine_cache_env,
                                         engine_cache_root)
from tuner.workers.measure import TrialTimings

# Lines as vLLM 0.24.0 (the CUDA wheel) writes them, and as 0.32.0 does with its prefix.
COMPILED_024 = ("(EngineCore_DP0 pid=812) INFO 12-03 10:02:11 [backends.py:394] Compiling a graph for compile "
                "range (1, 8192) takes 21.37 s")
LOADED_024 = ("(EngineCore_DP0 pid=812) INFO 12-03 10:12:40 [backends.py:292] Directly load the compiled graph(s) "
              "for compile range (1, 8192) from the cache, took 4.112 s")
LOADED_AOT = ("(EngineCore_DP0 pid=90) INFO 12-05 06:01:02 [decorators.py:311] Directly load AOT compilation "
              "from path /c/x")
COMPILED_032 = ("INFO 12-05 06:00:00 [backends.py:399] [backbone] Compiling a graph for compile range (1, 2048) "
                "takes 9.10 s")
CACHE_DIR = ("INFO [backends.py:1090] Using cache directory: /root/.cache/vllm/torch_compile_cache/ab12 for vLLM's "
             "torch.compile")
# The CPU build (0.32.0) on the tiny model, without enforce_eager: compiled and saved on the first launch, and on
# the second compiled again, as its cached function failed to load (seen on 2026-12-05).
CPU_SAVED = ("(Worker pid=4778) INFO 12-05 05:36:51 [decorators.py:743] [backbone] saved AOT compiled function to "
             "/tmp/cc/home/engine-cache/torch_compile_cache/torch_aot_compile/bd9d/rank_0_0/model")
CPU_AGAIN = ("(Worker pid=5077) WARNING 12-05 05:37:24 [decorators.py:333] [backbone] Compiling model again due to a "
             "load failure from /tmp/cc/home/engine-cache/torch_compile_cache/torch_aot_compile/bd9d/rank_0_0/model, "
             "reason: 'function' object has no attribute 'finalize_loading'")
EAGER = "INFO 12-05 06:00:00 [core.py:100] Cuda graph is disabled: enforce_eager=True"


@pytest.mark.parametrize("log, state", [
    ("\n".join([CACHE_DIR, COMPILED_024]), CompileCache.COLD),
    (COMPILED_032, CompileCache.COLD),
    ("\n".join([CACHE_DIR, LOADED_024]), CompileCache.WARM),
    (LOADED_AOT, CompileCache.WARM),
    (CPU_SAVED, CompileCache.COLD),
    ("\n".join([CPU_AGAIN, CPU_SAVED]), CompileCache.COLD),
    # A shape loaded from the cache beside one compiled anew: the launch paid for a compilation.
    ("\n".join([LOADED_024, COMPILED_024]), CompileCache.COLD),
    (EAGER, CompileCache.UNUSED),
    # The cache's folder named but the engine gone before it compiled anything.
    (CACHE_DIR, CompileCache.UNUSED),
    ("", CompileCache.UNUSED),
])
def test_the_log_says_how_the_engine_came_by_its_graphs(log, state):
    assert compile_cache_state(log) is state


def test_engines_share_one_cache_folder_under_tuners_home(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    assert engine_cache_root() == tmp_path / "engine-cache"
    assert engine_cache_env() == {"VLLM_CACHE_ROOT": str(tmp_path / "engine-cache")}


def test_a_cache_folder_the_user_chose_is_left_as_it_is(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/data/vllm-cache")
    assert engine_cache_env() == {}


def test_timings_keep_the_cache_state_and_older_records_read_as_unused():
    timings = TrialTimings(58.0, 120.0, 0.6, CompileCache.WARM)
    assert TrialTimings.from_dict(timings.to_dict()) == timings
    assert timings.to_dict()["compile_cache"] == "warm"
    older = {"startup_s": 92.0, "replay_s": 66.0, "teardown_s": 0.8, "total_s": 158.8}
    assert TrialTimings.from_dict(older).compile_cache is CompileCache.UNUSED
