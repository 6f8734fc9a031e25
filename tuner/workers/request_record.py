"""What one replayed request measured (`RequestRecord`) and how it ended (`Outcome`): the row a replay writes per
request, kept as requests.csv and in the database, and read by every figure and verdict after it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum


class Outcome(str, Enum):
    """How one replayed request ended; a str, stored as its value."""

    OK = "ok"  # streamed to the end with every requested token
    TRUNCATED = "truncated"  # finished normally but with fewer tokens than asked
    REJECTED = "rejected"  # refused as invalid with a 4xx status, e.g. longer than the server's max_model_len
    HTTP_ERROR = "http_error"  # any other error status (5xx, 429 overload), or an error event inside the stream
    TIMEOUT = "timeout"  # not finished within the per-request limit
    DISCONNECTED = "disconnected"  # connection refused, reset or closed before the stream ended
    NOT_SENT = "not_sent"  # the replay had ended (engine gone, or stopped) before this request's time came
    # in flight when the replay was stopped early, its trial hopeless (tuner.search.pruning.BoundaryWatch)
    STOPPED = "stopped"
    # In flight when its probe was cut, its verdict already certain (tuner.search.pruning.VerdictWatch): cancelled, so
    # that the engine frees it at once.
    CUT = "cut"

def prompt_thousands(input_tokens: int) -> float:
    """A prompt's length in thousands of tokens, a prompt under 1,000 counted as 1,000: what a TTFT limit per 1,000
    prompt tokens multiplies, so that it grows with a long prompt's prefill and holds a short one to a flat limit."""
    return max(input_tokens, 1000) / 1000


@dataclass(frozen=True)
class RequestRecord:
    """One replayed request as the client saw it: its schedule, its token counts, how it ended and its latencies
    (seconds; None where it never got that far)."""

    index: int
    scheduled_s: float  # offset from the replay's start at which it was due
    sent_s: float | None  # offset at which it actually went out
    requested_tokens: int
    input_tokens: int
    output_tokens: int
    outcome: Outcome
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_mean_s: float | None = None
    itl_p95_s: float | None = None
    itl_max_s: float | None = None
    status_code: int | None = None
    error: str | None = None
    # The server's own figure, where it reports per-request metrics (vLLM's --enable-per-request-metrics):
    # from the request's arrival at the engine to its first scheduling.
    queue_s: float | None = None

    @property
    def ttft_per_1k_prompt_s(self) -> float | None:
        """TTFT per 1,000 prompt tokens (`prompt_thousands`); None without a first token."""
        return None if self.ttft_s is None else self.ttft_s / prompt_thousands(self.input_tokens)

    @property
    def decode_s_per_token(self) -> float | None:
        """Its decode time per output token after the first, (e2e - ttft) / (tokens - 1); None without a second
        token."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def lateness_s(self) -> float | None:
        """How late the request left against its schedule, in seconds; None if it was never sent."""
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    def to_dict(self) -> dict:
        """As stored (a row of tuner_requests, and of the trial's requests CSV): the fields, the outcome as its
        value."""
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        """The record `to_dict` gave."""
        return cls(**{**data, "outcome": Outcome(data["outcome"])})

    @classmethod
    def from_row(cls, row: Mapping[str, str]) -> RequestRecord:
        """The record a row of a trial's requests.csv gives (`to_dict` written as text, None as an empty cell); a
        column the row lacks, written before its field came, takes the field's default."""
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name not in row:
                continue
            text, kind = row[f.name], str(f.type).removesuffix(" | None")
            values[f.name] = None if text == "" and kind != str(f.type) else _FROM_TEXT[kind](text)
        return cls(**values)  # type: ignore[arg-type]  # each value parsed by its field's type


# How requests.csv's text reads back, by the type a field of RequestRecord is annotated with.
_FROM_TEXT: dict[str, Callable[[str], object]] = {"int": int, "float": float, "str": str, "Outcome": Outcome}
