"""The run's and the study's options, each declared once (`tuner.supervisor.RunRequest`, `tuner.studies.StudyRequest`):
each field is an option of its command, and what the command builds or hands on reads back as the record."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from tuner.cli import app
from tuner.studies import StudyRequest
from tuner.supervisor import RunRequest, run_option, study_run_argv


def study_run_command():
    study = typer.main.get_command(app).commands["study"]
    return study.commands["run"]


def test_each_field_of_a_run_request_is_an_option_of_tuner_study_run():
    options = {option for param in study_run_command().params for option in (*param.opts, *param.secondary_opts)}
    for name, field in RunRequest.model_fields.items():
        assert run_option(field.alias or name) in options


def test_the_argv_of_a_run_reads_back_as_its_request():
    request = RunRequest(trials=3, parallel=2, timeout_s=90.5, budget_s=600.0, prune=False, validate=False, top=2,
                         repeats=3, pairing=False)
    argv = study_run_argv("s1", request, events=Path("events.jsonl"))
    assert argv[:5] == [sys.executable, "-m", "tuner", "study", "run"]
    given = study_run_command().make_context("run", argv[5:]).params
    assert given == {**given, "name": "s1", "as_json": True, "trials": 3, "parallel": 2, "timeout": 90.5,
                     "window": None, "budget": "600.0", "prune": False, "validate": False, "top": 2, "repeats": 3,
                     "pairing": False, "events": Path("events.jsonl")}


def test_options_left_unset_are_left_to_the_command_and_flags_are_given_either_way():
    argv = study_run_argv("s1", RunRequest(window_s=5.0))
    assert argv[6:] == ["--json", "--window", "5.0", "--prune", "--validate", "--top", "1", "--repeats", "2",
                        "--pairing"]
    given = study_run_command().make_context("run", argv[5:]).params
    assert (given["trials"], given["window"], given["events"]) == (None, "5.0", None)


def test_each_field_of_a_study_request_is_a_parameter_of_tuner_study_create():
    study = typer.main.get_command(app).commands["study"]
    params = {param.name for param in study.commands["create"].params}
    assert set(StudyRequest.model_fields) <= params


def test_tuner_study_create_asks_for_the_study_its_options_give(monkeypatch, tmp_path):
    asked: list[StudyRequest] = []

    class Answers:
        def create(self, request: StudyRequest):
            asked.append(request)
            raise typer.Exit(0)

    monkeypatch.setattr("tuner.cli.study.study_answers", lambda *where: Answers())
    result = CliRunner().invoke(app, ["study", "create", "s1", "--model", str(tmp_path / "m"), "--trace-latest",
                                      str(tmp_path), "--limit", "ttft_p95_s=1", "--limit", "e2e_p95_s=none",
                                      "--request-timeout", "30", "--spread", "--allow-fp8", "--probe-budget", "4",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert asked == [StudyRequest(name="s1", model=str(tmp_path / "m"), trace_latest=str(tmp_path),
                                  limits=["ttft_p95_s=1", "e2e_p95_s=none"], request_timeout_s=30.0, spread=True,
                                  allow_fp8=True, probe_budget=4)]
    refused = CliRunner().invoke(app, ["study", "create", "x" * 201])
    assert str(refused.exception) == "name: String should have at most 200 characters"  # as before: bad usage
