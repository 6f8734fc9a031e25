"""Writes what users and programs see of tuner into one folder: every CLI command's --help and the HTTP API's
OpenAPI document. Run it before and after a restructure, then `diff -r BEFORE AFTER`: a change of the code's
layout should change neither (issue 38).

    .venv/bin/python scripts/surface.py /tmp/surface-after
"""

import json
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from tuner.cli import app
from tuner.service.api import build_api
from tuner.studies import LocalStudies


def write_help(runner: CliRunner, command, path: list[str], out: Path) -> None:
    """`tuner PATH --help` at a fixed width, then the same for each subcommand."""
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
    (out / f"help-{'_'.join(path) or 'root'}.txt").write_text(result.output)
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        write_help(runner, sub, [*path, name], out)


def main() -> None:
    """Both into the folder named by the first argument."""
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_help(CliRunner(), typer.main.get_command(app), [], out)
    api = build_api(LocalStudies(None), None, None, None)
    (out / "openapi.json").write_text(json.dumps(api.openapi(), indent=1, sort_keys=True))
    print(f"{len(list(out.iterdir()))} files in {out}")


if __name__ == "__main__":
    main()
