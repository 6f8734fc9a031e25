"""Which part of a recorded trace a trial replays, and how it is reshaped: one record, applied in one order."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.common.errors import TunerError
from tuner.traces.readers import read_trace
from tuner.traces.records import Trace
from tuner.traces.transforms import FIT_MODES, cap_requests, fit_to_context, scale_rate, spread_buckets, window


@dataclass(frozen=True)
class TraceSelection:
    """Which part of a recorded trace is replayed, and how it is reshaped."""

    window_s: tuple[float, float] | None = None  # [start, end) in seconds from the trace's first request
    max_requests: int | None = None
    rate_scale: float | None = None  # 2.0 = twice the recorded rate
    fit: str | None = None  # "clip" or "scale" to max_model_len; None = replay lengths as recorded
    spread: bool = False  # requests sharing one recorded arrival spread over the interval to the next one

    def __post_init__(self) -> None:
        if self.fit is not None and self.fit not in FIT_MODES:
            raise TunerError(f"fit must be one of {', '.join(FIT_MODES)}, got {self.fit!r}")
        if self.max_requests is not None and self.max_requests < 1:
            raise TunerError(f"max_requests must be at least 1, got {self.max_requests}")

    @classmethod
    def from_options(cls, window: str | None, max_requests: int | None, rate_scale: float | None,
                     fit: str | None, spread: bool = False) -> "TraceSelection":
        """The selection as people type it (`--window 0:600` and so on)."""
        return cls(window_s=parse_window(window) if window else None, max_requests=max_requests,
                   rate_scale=rate_scale, fit=fit, spread=spread)

    def to_dict(self) -> dict:
        """As stored with the study (its `trace_selection` column): JSON-ready, the window as a pair or None."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TraceSelection:
        """The selection `to_dict` gave (a stored window comes back as a list)."""
        window_s = data.get("window_s")
        return cls(**{**data, "window_s": tuple(window_s) if window_s is not None else None})


def parse_window(text: str) -> tuple[float, float]:
    """`START:END` in seconds (either side may be empty: `:600`, `300:`)."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        window_s = (float(start) if start.strip() else 0.0, float(end) if end.strip() else float("inf"))
    except ValueError:
        raise TunerError(f"window must be START:END in seconds, got {text!r}") from None
    if math.isnan(window_s[0]) or math.isnan(window_s[1]):
        raise TunerError(f"window must be START:END in seconds, got {text!r}")
    if window_s[1] <= window_s[0]:
        raise TunerError(f"window end must be after its start, got {text!r}")
    return window_s


def load_trace(path: str | Path, selection: TraceSelection, max_model_len: int | None = None,
               format: str | None = None) -> Trace:
    """Read a trace and apply the selection: spread (on the recorded clock, whose intervals it needs), then window,
    cap, rate, and (with a max_model_len) fit."""
    trace = read_trace(path, format)
    if selection.spread:
        trace = spread_buckets(trace)
    if selection.window_s is not None:
        trace = window(trace, *selection.window_s)
    if selection.max_requests is not None:
        trace = cap_requests(trace, selection.max_requests)
    if selection.rate_scale is not None:
        trace = scale_rate(trace, selection.rate_scale)
    return fit_trace(trace, selection, max_model_len) if max_model_len is not None else trace


def fit_trace(trace: Trace, selection: TraceSelection, max_model_len: int) -> Trace:
    """The selection's fit to one engine's context (a study fits per trial: max_model_len may be searched)."""
    return fit_to_context(trace, max_model_len, selection.fit) if selection.fit is not None else trace
