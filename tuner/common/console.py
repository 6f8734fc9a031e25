"""The CLI's output: a console for people (stdout), one for progress and errors (stderr), JSON for programs."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# No markup: what is printed quotes paths, names and vLLM's messages as given, brackets included. Styling
# is done with rich.text.Text where wanted.
out = Console(markup=False)
err = Console(stderr=True, markup=False)


def progress_bar(disable: bool) -> Progress:
    """The bar on stderr for long work (off for --json): what is being done, done/of, time so far."""
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True, disable=disable)


def print_json(data: object) -> None:
    """Write `data` to stdout as indented JSON, for programs (--json); a value JSON cannot hold is written as its
    str()."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def fmt(value: object, digits: int = 3) -> str:
    """A number for a table cell: fixed decimals for floats, '-' for a missing value."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
