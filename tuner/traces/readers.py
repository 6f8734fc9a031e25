"""Read recorded request traces, in the formats they were published in, into a normalized Trace."""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from tuner.common.errors import TraceFormatError, TunerError
from tuner.traces.records import Trace, TraceRequest, Transformation

# Bounds that keep later float arithmetic (percentiles, rates) finite; no real trace comes near them.
_MAX_TOKENS = 10**9
_MAX_BLOCK_ID = 2**63 - 1  # ids must fit the int64 a replay may seed its token blocks with
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_EPOCH = datetime(1970, 1, 1)

# The column (CSV header) or key (first JSON object) that tells each format apart.
_CSV_SIGNATURES = {"TIMESTAMP": "azure", "Timestamp": "burstgpt"}
_JSON_SIGNATURES = {"arrival_s": "native", "timestamp": "mooncake"}

# Requests a replay cannot send, dropped as read: (reason, test); a request counts under the first match.
_UNREPLAYABLE: tuple[tuple[str, Callable[[TraceRequest], bool]], ...] = (
    ("0 response tokens", lambda r: r.output_tokens < 1),
    ("0 input tokens", lambda r: r.input_tokens < 1),
)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _split_lines(text: str) -> list[str]:
    # The same line splitting as the csv module sees, so that line numbers agree across formats.
    return io.StringIO(text, newline="").readlines()


@dataclass(frozen=True)
class _Record:
    """One CSV row or JSON object, with where it came from, and checked accessors for its values."""

    path: str
    line: int
    values: Mapping[str, object]
    textual: bool  # a CSV row, all of whose values are strings to parse; JSON has typed values

    def error(self, message: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.line, message)

    def get(self, name: str) -> object:
        if name not in self.values:
            raise self.error(f"missing field {name!r}")
        return self.values[name]

    def tokens(self, name: str) -> int:
        return self._count(name, self.get(name), _MAX_TOKENS)

    def seconds(self, name: str) -> float:
        """A non-negative finite number, from a CSV field or a JSON number."""
        value = self.get(name)
        if self.textual and isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value.strip())
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"{name} is not a number: {_show(value)}")
        try:
            number = float(value)
        except OverflowError:  # a JSON integer beyond float range
            number = math.inf
        if not math.isfinite(number):
            raise self.error(f"{name} is not a finite number: {_show(value)}")
        if number < 0:
            raise self.error(f"{name} is negative: {_show(value)}")
        return number

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self.error(f"{name} is not a string: {_show(value)}")
        return value.strip()

    def blocks(self, name: str) -> tuple[int, ...]:
        """Prefix block ids; the field is optional."""
        value = self.values.get(name, [])
        if not isinstance(value, list):
            raise self.error(f"{name} is not a list: {_show(value)}")
        return tuple(self._count(f"{name}[{i}]", v, _MAX_BLOCK_ID) for i, v in enumerate(value))

    def _count(self, name: str, value: object, limit: int) -> int:
        if self.textual and isinstance(value, str):
            digits = value.strip()
            if not _INT.fullmatch(digits):
                raise self.error(f"{name} is not an integer: {_show(value)}")
            if len(digits) > 20:  # int() refuses over 4300 digits; this many is out of bounds anyway
                raise self.error(f"{name} is too large (over {limit})")
            value = int(digits)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{name} is not an integer: {_show(value)}")
        if value < 0:
            raise self.error(f"{name} is negative: {value}")
        if value > limit:
            raise self.error(f"{name} is too large (over {limit})")
        return value


def _blank(row: list[str]) -> bool:
    return len(row) <= 1 and not "".join(row).strip()


def _csv_records(path: str, text: str, columns: tuple[str, ...]) -> Iterator[_Record]:
    """The data rows of a CSV file whose header must name `columns`."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [name.strip() for name in next((row for row in reader if not _blank(row)), [])]
        for column in columns:
            if column not in header:
                raise TraceFormatError(path, reader.line_num, f"header has no column {column!r}")
        for row in reader:
            if _blank(row):
                continue
            if len(row) != len(header):
                raise TraceFormatError(path, reader.line_num, f"{len(row)} fields, the header has {len(header)}")
            yield _Record(path, reader.line_num, dict(zip(header, row)), textual=True)
    except csv.Error as e:
        raise TraceFormatError(path, reader.line_num, f"not valid CSV: {e}") from None


def _json_records(path: str, text: str) -> Iterator[_Record]:
    """The objects of a JSON-lines file; blank lines are skipped."""
    for line, raw in enumerate(_split_lines(text), 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, line, f"not valid JSON: {e.msg}") from None
        except (ValueError, RecursionError):  # a number of over 4300 digits, or nesting too deep
            raise TraceFormatError(path, line, "not valid JSON: number too long or nesting too deep") from None
        if not isinstance(value, dict):
            raise TraceFormatError(path, line, f"expected a JSON object, got {type(value).__name__}")
        yield _Record(path, line, value, textual=False)


def _datetime_seconds(record: _Record, name: str) -> float:
    """Seconds since 1970 of a naive `YYYY-MM-DD HH:MM:SS[.fraction]`, the fraction of any length."""
    value = record.text(name)
    whole, _, fraction = value.partition(".")
    try:
        moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")  # %f would take at most 6 digits
    except ValueError:
        raise record.error(f"{name} is not a date and time: {_show(value)}") from None
    if fraction and not (fraction.isascii() and fraction.isdigit()):
        raise record.error(f"{name} is not a date and time: {_show(value)}")
    return (moment - _EPOCH).total_seconds() + float(f"0.{fraction or 0}")


def _read_azure(path: str, text: str) -> list[TraceRequest]:
    columns = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    return [
        TraceRequest(_datetime_seconds(r, "TIMESTAMP"), r.tokens("ContextTokens"), r.tokens("GeneratedTokens"))
        for r in _csv_records(path, text, columns)
    ]


def _read_burstgpt(path: str, text: str) -> list[TraceRequest]:
    columns = ("Timestamp", "Request tokens", "Response tokens")
    return [
        TraceRequest(r.seconds("Timestamp"), r.tokens("Request tokens"), r.tokens("Response tokens"))
        for r in _csv_records(path, text, columns)
    ]


def _read_mooncake(path: str, text: str) -> list[TraceRequest]:
    return [
        TraceRequest(
            r.seconds("timestamp") / 1000, r.tokens("input_length"), r.tokens("output_length"), r.blocks("hash_ids")
        )
        for r in _json_records(path, text)
    ]


def _read_native(path: str, text: str) -> list[TraceRequest]:
    return [
        TraceRequest(
            r.seconds("arrival_s"), r.tokens("input_tokens"), r.tokens("output_tokens"), r.blocks("prefix_blocks")
        )
        for r in _json_records(path, text)
    ]


# Each reader returns the requests in file order, arrivals on the file's own clock, in seconds.
READERS: dict[str, Callable[[str, str], list[TraceRequest]]] = {
    "azure": _read_azure,
    "burstgpt": _read_burstgpt,
    "mooncake": _read_mooncake,
    "native": _read_native,
}


def _detect(path: str, text: str) -> str:
    """The format, from the first non-blank line: a JSON object's keys or a CSV header's columns."""
    line, first = next((i, s) for i, s in enumerate(_split_lines(text), 1) if s.strip())
    if first.lstrip().startswith("{"):
        kind, signatures = "JSON object", _JSON_SIGNATURES
        keys: Iterable[str] = next(_json_records(path, text)).values
    else:
        kind, signatures = "CSV header", _CSV_SIGNATURES
        keys = [column.strip().strip('"') for column in first.split(",")]
    for key, name in signatures.items():
        if key in keys:
            return name
    expected = " or ".join(f"{key!r} ({name})" for key, name in signatures.items())
    raise TraceFormatError(path, line, f"unknown trace format: the {kind} has no {expected}")


def _load_text(path: str) -> tuple[str, bytes]:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TraceFormatError(path, None, f"cannot read the file: {e.strerror or e}") from None
    except ValueError:  # a path with a NUL character
        raise TraceFormatError(path, None, "cannot read the file: not a valid path") from None
    body = data.removeprefix(codecs.BOM_UTF8)
    try:
        return body.decode("utf-8"), data
    except UnicodeDecodeError as e:
        line = len(_split_lines(body[: e.start].decode("utf-8") + "x"))
        raise TraceFormatError(path, line, "not UTF-8 text") from None


def _normalize(trace: Trace, requests: list[TraceRequest]) -> Trace:
    """Drop unreplayable requests (recorded), sort by arrival (stable) and rebase to the first at 0."""
    if not requests:
        raise TraceFormatError(trace.source, None, "no requests in the file")
    steps = []
    for reason, unreplayable in _UNREPLAYABLE:
        kept = [r for r in requests if not unreplayable(r)]
        if len(kept) < len(requests):
            steps.append(Transformation("drop_failed", {"reason": reason}, affected=len(requests) - len(kept)))
        requests = kept
    if not requests:
        raise TraceFormatError(trace.source, None, "no requests with at least 1 input and 1 output token")
    requests = sorted(requests, key=lambda r: r.arrival_s)
    start = requests[0].arrival_s
    rebased = tuple(replace(r, arrival_s=r.arrival_s - start) for r in requests)
    return replace(trace, requests=rebased, transformations=tuple(steps))


def read_trace(path: str | Path, format: str | None = None) -> Trace:
    """Read a trace file; `format` (one of READERS) overrides detection from the file's first line."""
    source = str(path)
    if format is not None and format not in READERS:
        raise TunerError(f"unknown trace format {format!r}; one of: {', '.join(READERS)}")
    text, data = _load_text(source)
    if not text.strip():
        raise TraceFormatError(source, None, "empty file")
    format = format or _detect(source, text)
    trace = Trace(source=source, format=format, sha256=hashlib.sha256(data).hexdigest(), requests=())
    return _normalize(trace, READERS[format](source, text))
