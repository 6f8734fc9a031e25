"""The service's run and schedule answers through its FastAPI app (stand-ins for the run and schedule books): each
answer is typed in the OpenAPI document and comes out exactly as the record's JSON, whatever vintage of stored
morning summary it reads."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from fastapi.testclient import TestClient

from factories import MACHINE
from tuner.describe import RecommendationContext, boundary_line, hardware_line
from tuner.runs import RunRecord
from tuner.schedule_runs import ScheduleBest, ScheduleRun
from tuner.schedules import Schedule
from tuner.analysis.scoring import BOUNDARIES, Capacity, Score
from tuner.service.api import build_api
from tuner.storage import StoredScheduleRun, TrialState, ValidationMark
from tuner.studies import LocalStudies
from tuner.study.events import RunReport, TrialStarted, TrialSummary, logged_dict
from tuner.supervisor import RunState
from tuner.traces.selection import TraceSelection
from tuner.workers.engine_config import EngineConfig

SCORE = Score(1.25, 3.5, 40, 1.0, {"e2e_p95_s": -26.5}, [], Capacity(2.5, 1.5, 150.0, 3.0, 4, "edge found"))
DONE = TrialSummary(0, TrialState.COMPLETE, True, EngineConfig(), SCORE, validation=ValidationMark(1, 1, 2, 0, None))
PRUNED = TrialSummary(1, TrialState.PRUNED, False, EngineConfig(max_num_seqs=8), reason="p95 e2e over its limit")
IN_FLIGHT = TrialStarted(2, False, EngineConfig(max_num_seqs=4, enforce_eager=True), 0, 3.0)
RUN = RunRecord("r1", "s", 3, 1.0, RunState.STOPPED, 9.5, 130, None,
                RunReport([DONE, PRUNED], "the run was stopped (SIGINT)", None), (IN_FLIGHT,), (DONE, PRUNED))

BEST = {"trial": 3, "completed_rps": 1.5, "e2e_p95_s": 12, "serve_command": "vllm serve /models/tiny"}
CONTEXT = {"boundary": BOUNDARIES["interactive"].to_dict(), "boundary_text": boundary_line(BOUNDARIES["interactive"]),
           "hardware": asdict(MACHINE), "measured_on": hardware_line(MACHINE), "vllm_version": "0.11.0",
           "trace": {"path": "/traces/azure.csv", "sha256": "ab" * 32,
                     "selection": TraceSelection((300, 400), 8, 100.0, "clip").to_dict()}}
TRIALS = [{"number": 3, "state": "complete", "failure_class": None, "completed_rps": 1.5, "e2e_p95_s": 12,
           "feasible": True, "reason": None},
          {"number": 4, "state": "failed", "failure_class": "oom", "completed_rps": None, "e2e_p95_s": None,
           "feasible": None, "reason": "CUDA out of memory"}]
CAPACITY = {"capacity": SCORE.capacity.to_dict()}
# The morning summaries as stored (JSON), of each vintage: the best of a load search with its capacity, its context
# and its validation's verdict; then without the capacity; then without the verdict; then bare.
SUMMARIES = [json.loads(json.dumps({"trials": TRIALS, "best": best, "previous_best": previous,
                                    "stopped_early": None, "error": None}))
             for best, previous in [({**BEST, "validation": "not validated", **CAPACITY, **CONTEXT},
                                     {**BEST, "trial": 1, "validation": "not validated", **CONTEXT}),
                                    ({**BEST, "validation": "not validated", **CONTEXT}, None),
                                    ({**BEST, **CONTEXT}, {**BEST, "trial": 1, **CONTEXT}), (BEST, BEST)]]
SCHEDULE_RUNS = [ScheduleRun.of(StoredScheduleRun(
    schedule="nightly", study="s", state="finished", due_at="2026-12-01T01:00:00+00:00",
    started_at="2026-12-01T01:00:02+00:00", window_end="2026-12-01T06:00:00+00:00",
    finished_at="2026-12-01T05:59:00+00:00", summary=summary, id=i)) for i, summary in enumerate(SUMMARIES, start=1)]
SCHEDULE = Schedule("nightly", "s", "0 1 * * *", 18000.0, None, None, SCHEDULE_RUNS[0])


class Runs:
    def get(self, run_id: str) -> RunRecord:
        return RUN

    def list(self, study: str | None = None) -> list[RunRecord]:
        return [RUN, replace(RUN, id="r2", state=RunState.RUNNING, result=None, ended_at=None, exit_code=None)]

    def stop(self, run_id: str) -> RunRecord:
        return RUN


class Schedules:
    def get(self, name: str) -> Schedule:
        return SCHEDULE

    def list(self) -> list[Schedule]:
        return [SCHEDULE, replace(SCHEDULE, name="weekly", last_run=None)]

    def run_now(self, name: str) -> Schedule:
        return SCHEDULE

    def runs(self, name: str, limit: int | None = None) -> list[ScheduleRun]:
        return SCHEDULE_RUNS


def as_json(data) -> str:
    return json.dumps(data, sort_keys=False)


def test_runs_are_answered_as_their_records_json_and_read_back_as_the_records():
    http = TestClient(build_api(LocalStudies(None), Runs(), Schedules(), None))
    answer = http.get("/runs/r1").json()
    assert as_json(answer) == as_json(RUN.to_dict())
    assert answer["in_flight"] == [logged_dict(IN_FLIGHT)] and answer["result"] == RUN.result.to_dict()
    assert RunRecord.from_dict(answer) == RUN  # as `tuner study run --server` reads it back
    assert http.post("/runs/r1/stop").json() == answer
    assert as_json(http.get("/runs").json()) == as_json([run.to_dict() for run in Runs().list()])


def test_schedules_and_their_runs_are_answered_as_their_records_json_whatever_their_vintage():
    for run, summary in zip(SCHEDULE_RUNS, SUMMARIES):
        assert as_json({key: run.to_dict()[key] for key in summary}) == as_json(summary)  # as it was stored
    http = TestClient(build_api(LocalStudies(None), Runs(), Schedules(), None))
    assert as_json(http.get("/schedules/nightly/runs").json()) == \
        as_json([{**run.to_dict(), "summary": run.lines()} for run in SCHEDULE_RUNS])
    assert as_json(http.get("/schedules/nightly").json()) == as_json(SCHEDULE.to_dict())
    assert as_json(http.post("/schedules/nightly/run-now").json()) == as_json(SCHEDULE.to_dict())
    assert as_json(http.get("/schedules").json()) == as_json([s.to_dict() for s in Schedules().list()])


def test_the_morning_summary_states_a_load_searched_best_by_its_capacity():
    searched, fixed = SCHEDULE_RUNS[0].best, SCHEDULE_RUNS[0].previous_best
    assert searched.capacity == SCORE.capacity and fixed.capacity is None
    assert searched.line() == "trial 3: capacity 2.5 req/s, p95 e2e 12.00 s at your traffic"
    assert fixed.line() == "trial 1: 1.500 req/s, p95 e2e 12.00 s"


def test_a_morning_summarys_best_that_carries_only_part_of_your_traffic_says_so():
    short = replace(SCHEDULE_RUNS[0].best, violations=("ttft_p95_s 2.6 s is over the limit 2.0 s",))
    stored = json.loads(json.dumps(short.to_dict()))
    assert stored["violations"] == ["ttft_p95_s 2.6 s is over the limit 2.0 s"]
    assert ScheduleBest.from_dict(stored) == short and SCHEDULE_RUNS[0].best.violations == ()
    assert short.line() == ("trial 3: capacity 2.5 req/s, p95 e2e 12.00 s at your traffic; it does not carry your "
                            "traffic within the boundary (ttft_p95_s 2.6 s is over the limit 2.0 s), and no "
                            "configuration tried does: it carries the most of it")
    assert short.context.line(meets=False).startswith("falls short at your traffic of the interactive")
    # A kept default short of your traffic where a search trial carried it: stored, read back, and said.
    kept = replace(short, others_carry=True)
    again = ScheduleBest.from_dict(json.loads(json.dumps(kept.to_dict())))
    assert again == kept and again.others_carry and not ScheduleBest.from_dict(stored).others_carry
    assert again.line().endswith("other configurations tried did, yet launched again none carried more than vLLM's "
                                 "default beyond noise")


def test_the_morning_summary_reads_its_best_context_back_as_the_typed_record():
    context = SCHEDULE_RUNS[0].best.context
    assert context == RecommendationContext(BOUNDARIES["interactive"], MACHINE, "0.11.0", "/traces/azure.csv",
                                            "ab" * 32, TraceSelection((300, 400), 8, 100.0, "clip"))
    assert context.to_dict() == CONTEXT
    assert context.line() == (f"meets the {CONTEXT['boundary_text']} boundary; measured on {hardware_line(MACHINE)}, "
                              "vLLM 0.11.0, trace /traces/azure.csv (sha256 abababababab)")
    assert SCHEDULE_RUNS[3].best.context is None  # a summary stored before contexts were kept


def test_the_openapi_document_types_the_run_and_schedule_answers():
    schemas = TestClient(build_api(LocalStudies(None), Runs(), Schedules(), None)).get("/openapi.json").json()[
        "components"]["schemas"]
    run, schedule_run = schemas["RunAnswer"]["properties"], schemas["ScheduleRunAnswer"]["properties"]
    assert run["state"]["$ref"] == schedule_run["state"]["$ref"] == "#/components/schemas/RunState"
    assert run["finished"]["items"]["$ref"] == "#/components/schemas/TrialSummaryAnswer"
    assert run["in_flight"]["items"]["$ref"] == "#/components/schemas/TrialInFlight"
    assert schemas["RunReportAnswer"]["properties"]["trials"]["items"]["$ref"] == \
        "#/components/schemas/TrialSummaryAnswer"
    assert schedule_run["trials"]["items"]["$ref"] == "#/components/schemas/ScheduleTrialAnswer"
    assert {"$ref": "#/components/schemas/ScheduleBestInContext"} in schedule_run["best"]["anyOf"]
