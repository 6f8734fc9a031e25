"""`tuner compare` after a load search, without vLLM: the verdict compares capacities (which value carries more,
about the same within the search's precision, or which carries none and why), the table states each capacity,
and the JSON carries the probes and the capacity of each run."""

from __future__ import annotations

import pytest

from tuner.analysis.capacity import JudgedProbe, LoadPolicy, Verdict
from tuner.compare import CompareResult, CompareRun, capacity_verdict, parse_vary, verdicts
from tuner.analysis.scoring import Capacity, boundary
from tuner.workers.engine_config import EngineConfig
from tuner.workers.probes import Probe

from factories import measurement

SEARCH = LoadPolicy(precision=0.1, probe_budget=4)


def searched(label: str, rps: float | None, rate_scale: float | None = None,
             ended: str = "bracketed within 10%", failure_class: str | None = None) -> CompareRun:
    """A run whose load search found `rps` (None: no probe passed), at `rate_scale` times the trace's rate."""
    capacity = Capacity(rps=rps, factor=None if rps is None else rps / 2, rate_scale=rate_scale,
                        edge_rps=None, probes=4, ended=ended)
    failure = f"{failure_class}: the engine went away" if failure_class else None
    probe = JudgedProbe(Probe(0, 1.0, 0, 24, measurement(offered_rps=2.0)),
                        Verdict.PASS if rps else Verdict.FAIL, [] if rps else ["did not keep up"])
    return CompareRun(label, label.split("=")[1], measurement(), failure, failure_class, probes=(probe,),
                      capacity=capacity)


def failed(label: str, failure_class: str) -> CompareRun:
    """A run that never served, so never probed."""
    return CompareRun(label, label.split("=")[1], None, f"{failure_class}: too small", failure_class)


NONE = "no probe passed: the reference load failed"


@pytest.mark.parametrize("a, b, sentence", [
    (searched("max_num_seqs=1", 1.2, 0.6), searched("max_num_seqs=8", 3.4, 1.7),
     "max_num_seqs=8 rather than 1: carries more, 3.4 req/s (x1.7 the trace's rate) against 1.2 req/s (x0.6 the "
     "trace's rate) (+183%, one launch each, not validated)"),
    (searched("max_num_seqs=8", 3.4, 1.7), searched("max_num_seqs=1", 1.2, 0.6),
     "max_num_seqs=1 rather than 8: carries less, 1.2 req/s (x0.6 the trace's rate) against 3.4 req/s (x1.7 the "
     "trace's rate) (-65%, one launch each, not validated)"),
    (searched("max_num_seqs=64", 3.4, 1.7), searched("max_num_seqs=256", 3.7, 1.85),
     "max_num_seqs=256 rather than 64: about the same capacity, 3.7 req/s (x1.85 the trace's rate) against 3.4 "
     "req/s (x1.7 the trace's rate) (within the load search's 10% precision)"),
    (searched("max_num_seqs=1", None, ended=NONE), searched("max_num_seqs=8", 3.4, 1.7),
     "max_num_seqs=8 rather than 1: carries 3.4 req/s (x1.7 the trace's rate) within the boundary, where "
     "max_num_seqs=1 carries none (no probe passed: the reference load failed)"),
    (searched("max_num_seqs=8", 3.4, 1.7), searched("max_num_seqs=1", None, ended=NONE),
     "max_num_seqs=1 rather than 8: carries no load probed within the boundary (no probe passed: the reference "
     "load failed), where max_num_seqs=8 carries 3.4 req/s (x1.7 the trace's rate)"),
    (searched("max_num_seqs=64", 2.0, 1.0), failed("max_num_seqs=4", "kv_insufficient"),
     "max_num_seqs=4 rather than 64: carries no load probed within the boundary (kv_insufficient: too small), "
     "where max_num_seqs=64 carries 2 req/s (x1 the trace's rate)"),
    (searched("max_num_seqs=1", None, ended=NONE), searched("max_num_seqs=2", None, ended="no probe passed"),
     "max_num_seqs=2 rather than 1: neither carries any load probed within the boundary (max_num_seqs=1: no probe "
     "passed: the reference load failed; max_num_seqs=2: no probe passed)"),
    # Neither served: the sentence a fixed load gives.
    (failed("max_num_seqs=1", "load_oom"), failed("max_num_seqs=2", "load_oom"),
     "max_num_seqs=2 rather than 1: neither served (max_num_seqs=1: load_oom: too small; max_num_seqs=2: "
     "load_oom: too small)"),
])
def test_the_verdict_says_which_value_carries_more_or_why_one_carries_none(a, b, sentence):
    assert capacity_verdict("max_num_seqs", a, b, 0.1) == sentence


def test_capacities_within_the_search_precision_are_about_the_same_and_beyond_it_told_apart():
    a, b = searched("max_num_seqs=64", 3.4, 1.7), searched("max_num_seqs=256", 3.7, 1.85)
    assert "about the same capacity" in capacity_verdict("max_num_seqs", a, b, 0.1)
    assert "carries more" in capacity_verdict("max_num_seqs", a, searched("max_num_seqs=256", 3.8, 1.9), 0.1)
    assert "carries more" in capacity_verdict("max_num_seqs", a, b, 0.05)  # a finer search tells them apart


def test_verdicts_compare_capacities_after_a_search_and_measurements_at_a_fixed_load():
    runs = [searched("max_num_seqs=1", 1.0, 0.5), searched("max_num_seqs=8", 3.0, 1.5)]
    (by_capacity,) = verdicts("max_num_seqs", runs, SEARCH)
    assert by_capacity.startswith("max_num_seqs=8 rather than 1: carries more")
    (by_measurement,) = verdicts("max_num_seqs", runs, LoadPolicy.fixed())
    assert by_measurement == verdicts("max_num_seqs", runs)[0]
    assert "p95 end-to-end" in by_measurement and "carries" not in by_measurement
    result = CompareResult(parse_vary("max_num_seqs=1,8"), EngineConfig(), runs, boundary("interactive"), SEARCH)
    assert result.verdicts == [by_capacity]


def test_the_table_and_the_json_state_each_capacity_and_the_probes():
    from tuner.cli.report import _compare_rows, _run_dict

    runs = [searched("max_num_seqs=1", None, ended="no probe passed"), searched("max_num_seqs=8", 3.4, 1.7),
            failed("max_num_seqs=64", "kv_insufficient")]
    result = CompareResult(parse_vary("max_num_seqs=1,8,64"), EngineConfig(), runs, boundary("interactive"),
                           SEARCH)
    rows = {str(what): cells for what, cells in _compare_rows(result)}
    assert [str(c) for c in rows["capacity req/s (x the trace's rate)"]] == [
        "none", "3.4 req/s (x1.7 the trace's rate)", "-"]
    assert rows["how the search ended"] == ["no probe passed", "bracketed within 10%", "-"]
    assert rows["probes"] == ["1", "1", "0"]
    assert "at the reference load" in rows and "meets the interactive boundary there" in rows
    data = _run_dict(runs[1])
    assert data["capacity"]["rps"] == 3.4 and data["capacity"]["ended"] == "bracketed within 10%"
    assert [p["verdict"] for p in data["probes"]] == ["pass"]
    assert data["probes"][0]["measurement"]["offered_rps"] == 2.0
    assert _run_dict(runs[2])["probes"] == [] and _run_dict(runs[2])["capacity"] is None
