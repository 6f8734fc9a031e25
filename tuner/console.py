"""The CLI's output: a console for people (stdout), one for progress and errors (stderr), JSON for programs."""

from __future__ import annotations

import json
import sys

from rich.console import Console

out = Console()
err = Console(stderr=True)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def fmt(value: object, digits: int = 3) -> str:
    """A number for a table cell: fixed decimals for floats, '-' for a missing value."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
