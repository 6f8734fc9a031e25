"""A run's options, declared once (`tuner.supervisor.RunRequest`): each field is an option of `tuner study run`, and
the argv a service or a schedule starts a run's child with reads back as the request it came from."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tuner.cli import app
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
                         repeats=3)
    argv = study_run_argv("s1", request, events=Path("events.jsonl"))
    assert argv[:5] == [sys.executable, "-m", "tuner", "study", "run"]
    given = study_run_command().make_context("run", argv[5:]).params
    assert given == {**given, "name": "s1", "as_json": True, "trials": 3, "parallel": 2, "timeout": 90.5,
                     "window": None, "budget": "600.0", "prune": False, "validate": False, "top": 2, "repeats": 3,
                     "events": Path("events.jsonl")}


def test_options_left_unset_are_left_to_the_command_and_flags_are_given_either_way():
    argv = study_run_argv("s1", RunRequest(window_s=5.0))
    assert argv[6:] == ["--json", "--window", "5.0", "--prune", "--validate", "--top", "1", "--repeats", "2"]
    given = study_run_command().make_context("run", argv[5:]).params
    assert (given["trials"], given["window"], given["events"]) == (None, "5.0", None)
