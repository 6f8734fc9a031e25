"""tuner.runs on a stand-in for `tuner study run` (a small Python program that prints a run's report beside the
events file a run wrote): the run is read back as typed records, and the service answers it as the events file
and the report hold it."""

from __future__ import annotations

import json
import os
import sys

from tuner.runs import EVENTS_FILE, RunRecord, _Run
from tuner.analysis.scoring import Capacity, Score
from tuner.storage import TrialState, ValidationMark
from tuner.study.budget import BudgetPlan
from tuner.study.events import (BudgetPlanned, RunReport, TrialDone, TrialStarted, TrialSummary, event_line,
                                read_event_line)
from tuner.supervisor import RunState, StudyRunChild
from tuner.workers.engine_config import EngineConfig

SCORE = Score(1.25, 3.5, 40, 1.0, {"e2e_p95_s": -26.5}, [], Capacity(2.5, 1.5, 150.0, 3.0, 4, "edge found"))
DONE = TrialSummary(0, TrialState.COMPLETE, True, EngineConfig(), SCORE, validation=ValidationMark(1, 1, 2, 0, None))
PRUNED = TrialSummary(1, TrialState.PRUNED, False, EngineConfig(max_num_seqs=8), reason="p95 e2e over its limit")
PLAN = BudgetPlan("CPU slot", 1, 600.0, 60.0, 90.0, 3, 4, True, 1, 6)
STARTED = [TrialStarted(0, True, EngineConfig(), 0, 1.5), TrialStarted(1, False, EngineConfig(max_num_seqs=8), 1, 2.25),
           TrialStarted(2, False, EngineConfig(max_num_seqs=4, enforce_eager=True), 0, 3.0)]


def test_each_event_reads_back_from_its_line_and_a_line_being_written_reads_as_none():
    for event in [*STARTED, TrialDone(DONE), TrialDone(PRUNED), BudgetPlanned(PLAN)]:
        assert read_event_line(event_line(event)) == event
    assert read_event_line(event_line(STARTED[0])[:20]) is None


def test_a_run_is_read_from_its_events_and_answered_as_they_and_its_report_hold_them(tmp_path):
    lines = [event_line(e) for e in (BudgetPlanned(PLAN), STARTED[0], STARTED[1], TrialDone(DONE), TrialDone(PRUNED),
                                     STARTED[2])]
    (tmp_path / EVENTS_FILE).write_text("".join(lines) + '{"kind": "trial_do')  # the last line is being written
    report = RunReport([DONE, PRUNED], stopped_early="the run was stopped (SIGINT)", validation=None, plan=PLAN)
    printed = json.dumps(report.to_dict())
    child = StudyRunChild.start([sys.executable, "-c", f"print({printed!r})"], dict(os.environ), tmp_path)
    assert child.wait(30) is not None
    record = _Run(RunRecord("r1", "s", 3, 1.0), child).refresh()
    assert (record.state, record.exit_code, record.error) == (RunState.FINISHED, 0, None)
    assert record.in_flight == (STARTED[2],) and record.finished == (DONE, PRUNED) and record.result == report
    assert record.plan == PLAN  # the budget's plan, as the run said it
    # What the service answers: the events' and the report's own JSON.
    assert json.dumps(record.to_dict()) == json.dumps({
        "id": "r1", "study": "s", "trials": 3, "started_at": 1.0, "state": "finished", "ended_at": record.ended_at,
        "exit_code": 0, "error": None, "result": json.loads(printed), "in_flight": [json.loads(lines[-1])],
        "finished": [json.loads(line)["summary"] for line in lines[3:5]], "progress": {"done": 2, "of": 3},
        "plan": json.loads(lines[0])["plan"]})


def test_the_runs_report_carries_its_budget_plan_as_the_run_last_said_it():
    paired = BudgetPlan("GPU", 1, 1200.0, 250.0, 250.0, 1, 4, True, 1, 5, no_candidate=True, validation_s=780.0,
                        paired=True)
    for plan in (paired, None):
        report = RunReport([DONE], plan=plan)
        assert RunReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    assert RunReport([DONE], plan=paired).to_dict()["plan"]["text"] == paired.text()
