"""The precision check: a study that allows FP8 measures vLLM's default with it right after the baseline, and its
validation launches and re-runs keep it on vLLM's default. FP8 cannot run on the CPU build, so the study is created
as on an H100 (the machine's description is the one stand-in); nothing is launched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.common.hardware import HardwareInfo
from tuner.analysis.kv_budget import DeviceMemory, read_model_memory
from tuner.common.models import write_architecture
from tuner.search_spaces.derive import derive_space
from tuner.storage import ValidationMark
from tuner.study.attrs import BASELINE_ATTR, ON_DEFAULT_ATTR
from tuner.study.create import create_study
from tuner.study.plan import StoragePlan
from tuner.study.runner import StudyRunner
from tuner.common.paths import bundled_trace
from tuner.traces.selection import TraceSelection, load_trace
from tuner.analysis.capacity import LoadPolicy

H100 = HardwareInfo("cuda", "NVIDIA H100 80GB HBM3", 79.6, 1, "cpu", 16, 128.0, gpu_compute_capability=9.0)


@pytest.fixture
def on_an_h100(monkeypatch):
    monkeypatch.setattr("tuner.study.create.detect_hardware", lambda: H100)


def _study(tmp_path, allow_fp8: bool) -> StudyRunner:
    model = write_architecture("llama-3.1-8b", tmp_path / "llama")
    plan = StoragePlan.resolve(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    create_study("s", model=model, trace_path=bundled_trace(), space="auto", boundary_name="interactive", limits={},
                 plan=plan, load=LoadPolicy(), selection=TraceSelection(max_requests=300, rate_scale=3.5),
                 allow_fp8=allow_fp8)
    return StudyRunner("s", plan)


def test_the_precision_check_is_vllms_default_with_every_fp8_choice_the_space_offers(tmp_path):
    model = read_model_memory(write_architecture("llama-3.1-8b", tmp_path / "llama"))
    trace = load_trace(bundled_trace(), TraceSelection())
    h100 = DeviceMemory.of_machine(H100)
    assert derive_space(model, h100, trace, "clip", fp8=True).space.precision() == {
        "quantization": "fp8", "kv_cache_dtype": "fp8"}
    assert derive_space(model, h100, trace, "clip").space.precision() == {}


def test_a_study_that_allows_fp8_runs_the_precision_check_after_the_baseline(tmp_path, on_an_h100):
    runner = _study(tmp_path, allow_fp8=True)
    baseline = runner.opened.study.ask()
    assert runner.launches.config(baseline) == (runner.opened.ctx.space.baseline(), True)
    assert baseline.user_attrs[BASELINE_ATTR]
    check = runner.opened.study.ask()
    config, is_baseline = runner.launches.config(check)
    # The baseline in every other setting: the space's grids (max_num_seqs, max_model_len, ...) are not asked.
    assert not is_baseline
    assert config == replace(runner.opened.ctx.space.baseline(), quantization="fp8", kv_cache_dtype="fp8")
    assert check.params == {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    assert check.user_attrs[ON_DEFAULT_ATTR] == ["kv_cache_dtype", "quantization"]
    runner.opened.study.tell(check, [20.0, 1.0])
    # A validation launch of it runs the same configuration, not the space's other settings sampled anew.
    runner.launches.queue(ValidationMark(1, 1, 2, 1, check.number), runner.opened.study.trials[check.number])
    launch = runner.opened.study.ask()
    assert runner.launches.config(launch) == (config, False)
    # The sampler's own proposals ask every setting the space searches.
    proposal = runner.opened.study.ask()
    runner.launches.config(proposal)
    assert set(proposal.params) == set(runner.opened.ctx.space.parameters)
    assert ON_DEFAULT_ATTR not in proposal.user_attrs


def test_without_fp8_allowed_only_the_baseline_is_queued(tmp_path, on_an_h100):
    runner = _study(tmp_path, allow_fp8=False)
    assert [t.user_attrs for t in runner.opened.study.trials] == [{BASELINE_ATTR: True}]
