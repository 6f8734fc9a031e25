"""Durations as people write them on the command line and in schedules: `5h`, `30m`, `90s`, `1h30m`."""

from __future__ import annotations

import math
import re

from tuner.common.errors import TunerError

_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[hms])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `5h`, `30m`, `90s` or `1h30m` (a bare number is seconds)."""
    compact = text.strip().lower().replace(" ", "")
    try:
        seconds = float(compact)
    except ValueError:
        if not _DURATION.fullmatch(compact):
            raise TunerError(f"a duration is like 5h, 30m, 90s or 1h30m, got {text!r}") from None
        seconds = sum(float(number) * _UNIT_S[unit] for number, unit in _DURATION_PART.findall(compact))
    if not math.isfinite(seconds) or seconds <= 0:
        raise TunerError(f"a duration must be more than 0 s, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """`seconds` as `parse_duration` reads it back: `0.25s` and `45s` to three digits, `5m22s` and `1h02m10s` to the
    second."""
    if seconds < 59.5:
        return f"{seconds:.3g}s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
