"""Trace reading, normalization, transformations and statistics, on the real published traces and on broken files."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.common.errors import TraceFormatError, TunerError
from tuner.traces.readers import read_trace
from tuner.traces.records import Trace, TraceFit, TraceRequest, Transformation
from tuner.traces.stats import trace_stats, typical_reuse_window
from tuner.traces.selection import TraceSelection, load_trace
from tuner.traces.transforms import cap_requests, fit_to_context, scale_rate, spread_buckets, window
from tuner.workers.trial import TrialTrace

from checks import assert_valid, mostly

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"

# /work/shared/traces/README.md, verbatim: rows, span s, rate, CV of gaps, input p50/p95/p99, output p50/p95/p99,
# sha256 prefix.
README_TABLE = {
    "azure_conv_2023.csv": ("19,366", "3,502", "5.53", "1.09", "1020 / 4083 / 4142", "129 / 451 / 601", "2f1e5b666d4e"),
    "azure_code_2023.csv": ("8,819", "3,436", "2.57", "13.2", "1469 / 7303 / 7436", "13 / 90 / 251", "54e9a6d2a4bd"),
    "mooncake_conversation_trace.jsonl": (
        "12,031", "3,537", "3.40", "3.03", "6909 / 39551 / 85400", "350 / 698 / 1119", "b8cbb061a852",
    ),
    "burstgpt_1_first400.csv": (
        "400", "37,269", "0.011", "4.56", "353 / 1639 / 1958", "238 / 842 / 1425", "7865fda5dac5",
    ),
}
FORMATS = {
    "azure_conv_2023.csv": "azure",
    "azure_code_2023.csv": "azure",
    "mooncake_conversation_trace.jsonl": "mooncake",
    "burstgpt_1_first400.csv": "burstgpt",
}


def matches_table(actual: float, shown: str) -> bool:
    """Whether `actual` rounds to the table's figure, i.e. lies within half a unit of its last digit."""
    figure = Decimal(shown.replace(",", ""))
    half_unit = Decimal(1).scaleb(figure.as_tuple().exponent) / 2
    return abs(Decimal(actual) - figure) <= half_unit


# --- the real traces ---


@pytest.mark.parametrize("name", sorted(README_TABLE))
def test_real_trace_lengths_and_identity_match_readme(name: str) -> None:
    trace = read_trace(TRACES / name)
    _, span, _, _, inputs, outputs, sha = README_TABLE[name]
    stats = trace_stats(trace)
    assert trace.format == FORMATS[name]
    assert trace.source == str(TRACES / name)
    assert trace.sha256 == hashlib.sha256((TRACES / name).read_bytes()).hexdigest()
    assert trace.sha256.startswith(sha)
    assert_valid(trace)
    assert matches_table(stats.span_s, span)
    for field, shown in zip(("input_p50", "input_p95", "input_p99"), inputs.split(" / ")):
        assert matches_table(getattr(stats, field), shown), (field, getattr(stats, field), shown)
    for field, shown in zip(("output_p50", "output_p95", "output_p99"), outputs.split(" / ")):
        assert matches_table(getattr(stats, field), shown), (field, getattr(stats, field), shown)


@pytest.mark.parametrize("name", ["azure_conv_2023.csv", "azure_code_2023.csv", "mooncake_conversation_trace.jsonl"])
def test_real_trace_pacing_matches_readme(name: str) -> None:
    trace = read_trace(TRACES / name)
    rows, _, rate, cv, *_ = README_TABLE[name]
    stats = trace_stats(trace)
    assert stats.requests == int(rows.replace(",", ""))
    assert trace.transformations == ()
    assert matches_table(stats.rate_rps, rate)
    assert matches_table(stats.gap_cv, cv)


def test_burstgpt_drops_failures_and_readme_pacing_counts_them() -> None:
    path = TRACES / "burstgpt_1_first400.csv"
    trace = read_trace(path)
    assert len(trace.requests) == 383
    assert trace.transformations == (Transformation("drop_failed", {"reason": "0 response tokens"}, affected=17),)
    stats = trace_stats(trace)
    assert stats.rate_rps == pytest.approx(383 / 37269)
    assert stats.gap_cv == pytest.approx(4.4637, abs=1e-4)
    # The README's rows, rate and CV are of all 400 published rows, failures included (its percentiles are
    # of the 383 kept): check that against the raw rows, so that both figures are known to be right.
    with path.open(newline="") as f:
        raw = sorted(float(row["Timestamp"]) for row in csv.DictReader(f))
    everything = Trace("raw", "burstgpt", "", tuple(TraceRequest(t - raw[0], 1, 1) for t in raw))
    rows, _, rate, cv, *_ = README_TABLE["burstgpt_1_first400.csv"]
    assert len(raw) == int(rows)
    assert matches_table(trace_stats(everything).rate_rps, rate)
    assert matches_table(trace_stats(everything).gap_cv, cv)


def test_mooncake_keeps_prefix_blocks() -> None:
    trace = read_trace(TRACES / "mooncake_conversation_trace.jsonl")
    first = trace.requests[0]
    assert (first.input_tokens, first.output_tokens) == (6758, 500)
    assert first.prefix_blocks == tuple(range(14))
    assert all(r.prefix_blocks for r in trace.requests)
    # The README: "at most 36.6% of blocks repeat".
    assert trace_stats(trace).prefix_block_share == pytest.approx(0.366, abs=5e-4)
    assert trace.requests[-1].arrival_s == pytest.approx(3536.999)


def test_azure_timestamps_keep_seven_fractional_digits_across_midnight(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.9799600,4808,10\n"
        "2023-11-17 00:00:00.0319601,3180,8\n"
        "2023-11-17 00:00:01,7,9\n"
    )
    trace = read_trace(path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0, 0.0520001, 1.02004], abs=1e-7)
    assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == [(4808, 10), (3180, 8), (7, 9)]


# --- normalization ---


def test_native_is_detected_sorted_stably_and_rebased(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        {"arrival_s": 12.5, "input_tokens": 3, "output_tokens": 4},
        {"arrival_s": 10, "input_tokens": 1, "output_tokens": 2, "prefix_blocks": [7, 8]},
        {"arrival_s": 12.5, "input_tokens": 5, "output_tokens": 6},
    ]
    path.write_bytes(b"\r\n".join([b""] + [json.dumps(x).encode() for x in lines] + [b"  ", b""]))
    trace = read_trace(path)
    assert trace.format == "native"
    assert trace.requests == (
        TraceRequest(0.0, 1, 2, (7, 8)),
        TraceRequest(2.5, 3, 4),
        TraceRequest(2.5, 5, 6),
    )
    assert trace.transformations == ()


def test_csv_with_byte_order_mark_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_bytes(
        "\ufeffTimestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n"
        "5,ChatGPT,472,18,490,Conversation log\r\n"
        "45.5,GPT-4,1087,230,1317,API log\r\n".encode()
    )
    trace = read_trace(path)
    assert trace.format == "burstgpt"
    assert trace.requests == (TraceRequest(0.0, 472, 18), TraceRequest(40.5, 1087, 230))


def test_unreplayable_rows_are_dropped_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "z.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,0,5\n"
        "2023-11-16 18:00:01.0,5,0\n"
        "2023-11-16 18:00:02.0,0,0\n"
        "2023-11-16 18:00:03.0,3,4\n"
    )
    trace = read_trace(path)
    assert trace.requests == (TraceRequest(0.0, 3, 4),)
    assert trace.transformations == (
        Transformation("drop_failed", {"reason": "0 response tokens"}, affected=2),
        Transformation("drop_failed", {"reason": "0 input tokens"}, affected=1),
    )


def test_explicit_format_overrides_detection(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 1500, "input_length": 3, "output_length": 4, "hash_ids": [1]}\n')
    assert read_trace(path, "mooncake").requests == (TraceRequest(0.0, 3, 4, (1,)),)
    with pytest.raises(TraceFormatError, match=r"m\.jsonl:1: missing field 'arrival_s'"):
        read_trace(path, "native")
    with pytest.raises(TunerError, match="unknown trace format 'parquet'"):
        read_trace(path, "parquet")


# --- broken files ---

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:17:03.9799600,10,5\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'
NATIVE_ROW = '{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5}\n'

BROKEN_LINES = [
    ("trace.csv", AZURE_HEADER + AZURE_ROW + "2023-11-16 18:17:04.0,10,abc\n", 3,
     "GeneratedTokens is not an integer: 'abc'"),
    ("neg.csv", AZURE_HEADER + "2023-11-16 18:17:04.0,-4,5\n", 2, "ContextTokens is negative: -4"),
    ("float.csv", AZURE_HEADER + AZURE_ROW * 2 + "2023-11-16 18:17:04.0,1.5,5\n", 4, "ContextTokens is not an integer"),
    ("date.csv", AZURE_HEADER + "2023-13-45 99:00:00.1,10,5\n", 2, "TIMESTAMP is not a date and time"),
    ("frac.csv", AZURE_HEADER + AZURE_ROW + "2023-11-16 18:17:03.12a,10,5\n", 3, "TIMESTAMP is not a date and time"),
    ("cols.csv", "TIMESTAMP,ContextTokens\n" + AZURE_ROW, 1, "header has no column 'GeneratedTokens'"),
    ("short.csv", AZURE_HEADER + AZURE_ROW + "2023-11-16 18:17:04.0,10\n", 3, "2 fields, the header has 3"),
    ("late.csv", "\n\n" + AZURE_HEADER + "2023-11-16 18:17:04.0,10\n", 4, "2 fields, the header has 3"),
    ("time.csv", BURST_HEADER + "soon,ChatGPT,4,5,9,x\n", 2, "Timestamp is not a number: 'soon'"),
    ("nan.csv", BURST_HEADER + "5,ChatGPT,4,5,9,x\nnan,ChatGPT,4,5,9,x\n", 3, "Timestamp is not a number: 'nan'"),
    ("inf.csv", BURST_HEADER + "1e999,ChatGPT,4,5,9,x\n", 2, "Timestamp is not a finite number"),
    ("huge.csv", BURST_HEADER + "5,ChatGPT," + "9" * 5000 + ",5,9,x\n", 2, "Request tokens is too large"),
    ("field.csv", BURST_HEADER + '5,"' + "x" * 200_000 + '",4,5,9,x\n', 2, "not valid CSV"),
    ("json.jsonl", MOONCAKE_ROW + '{"timestamp": 0, \n', 2, "not valid JSON"),
    ("list.jsonl", MOONCAKE_ROW + "\n[1, 2]\n", 3, "expected a JSON object, got list"),
    ("field.jsonl", MOONCAKE_ROW + '{"timestamp": 0, "input_length": 10}\n', 2, "missing field 'output_length'"),
    ("nan.jsonl", MOONCAKE_ROW + MOONCAKE_ROW.replace(": 0,", ": NaN,", 1), 2, "timestamp is not a finite number"),
    ("big.jsonl", MOONCAKE_ROW.replace(": 0,", ": 1" + "0" * 400 + ",", 1), 1, "timestamp is not a finite number"),
    ("digits.jsonl", MOONCAKE_ROW.replace(": 0,", ": " + "1" * 5000 + ",", 1), 1, "not valid JSON"),
    ("bool.jsonl", MOONCAKE_ROW.replace(": 10,", ": true,"), 1, "input_length is not an integer: True"),
    ("ids.jsonl", MOONCAKE_ROW.replace("[0]", '"abc"'), 1, "hash_ids is not a list"),
    ("negid.jsonl", MOONCAKE_ROW.replace("[0]", "[1, -2]"), 1, "hash_ids[1] is negative: -2"),
    ("toolong.jsonl", MOONCAKE_ROW.replace('"output_length": 5', '"output_length": 10000000000'), 1, "too large"),
    ("neg.jsonl", NATIVE_ROW + NATIVE_ROW.replace(": 0,", ": -1.5,"), 2, "arrival_s is negative: -1.5"),
    ("str.jsonl", NATIVE_ROW.replace("10", '"10"'), 1, "input_tokens is not an integer: '10'"),
    ("deep.jsonl", NATIVE_ROW + '{"arrival_s": ' + "[" * 100_000 + "]" * 100_000 + "}\n", 2, "not valid JSON"),
    ("header.csv", "time,in,out\n1,2,3\n", 1, "unknown trace format"),
    ("keys.jsonl", '\n\n{"t": 1, "in": 2}\n', 3, "unknown trace format"),
]


@pytest.mark.parametrize(("name", "content", "line", "message"), BROKEN_LINES, ids=[c[0] for c in BROKEN_LINES])
def test_broken_line_names_file_and_line(tmp_path: Path, name: str, content: str, line: int, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    assert caught.value.line == line
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (AZURE_HEADER.encode() + b"\xff\xfe\x00\n", 2),
        (b"\xef\xbb\xbf" + AZURE_HEADER.encode() + AZURE_ROW.encode() + b"2023\xc3", 3),
        (b"\x89PNG\r\n\x1a\n\x00\x00", 1),
    ],
)
def test_undecodable_file_names_the_line(tmp_path: Path, content: bytes, line: int) -> None:
    path = tmp_path / "bin.csv"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=rf"bin\.csv:{line}: not UTF-8 text"):
        read_trace(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("\n \r\n\t\n", "empty file"),
        (AZURE_HEADER, "no requests in the file"),
        (AZURE_HEADER + "2023-11-16 18:17:03.9799600,10,0\n", "no requests with at least 1 input and 1 output token"),
    ],
)
def test_file_without_requests(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "none.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    assert caught.value.line is None
    assert str(caught.value) == f"{path}: {message}"


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for path in (tmp_path / "absent.csv", tmp_path):
        with pytest.raises(TraceFormatError) as caught:
            read_trace(path)
        assert caught.value.line is None
        assert str(caught.value).startswith(f"{path}: cannot read the file")


# --- no byte content escapes as another exception ---

TOKENS = st.integers(0, 5000)
SECONDS = st.floats(0, 1e6)
STAMP = st.datetimes(datetime(2000, 1, 1), datetime(2030, 1, 1)).map(lambda d: f"{d:%Y-%m-%d %H:%M:%S.%f}0")
JUNK_FIELD = st.one_of(
    st.integers(-3, 10**25).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str), st.text(max_size=6)
)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**30) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
# Per format: the header line (CSV) or "" (JSON lines), and a plausible value of each column or key.
FUZZ: dict[str, tuple[str, dict[str, st.SearchStrategy]]] = {
    "azure": (AZURE_HEADER, {"TIMESTAMP": STAMP, "ContextTokens": TOKENS.map(str), "GeneratedTokens": TOKENS.map(str)}),
    "burstgpt": (
        BURST_HEADER,
        {
            "Timestamp": SECONDS.map(str),
            "Model": st.sampled_from(["ChatGPT", "GPT-4"]),
            "Request tokens": TOKENS.map(str),
            "Response tokens": TOKENS.map(str),
            "Total tokens": TOKENS.map(str),
            "Log Type": st.just("Conversation log"),
        },
    ),
    "mooncake": (
        "",
        {
            "timestamp": st.integers(0, 10**7),
            "input_length": TOKENS,
            "output_length": TOKENS,
            "hash_ids": st.lists(st.integers(0, 50), max_size=4),
        },
    ),
    "native": (
        "",
        {
            "arrival_s": SECONDS,
            "input_tokens": TOKENS,
            "output_tokens": TOKENS,
            "prefix_blocks": st.lists(st.integers(0, 50), max_size=4),
        },
    ),
}


def fuzz_file(fmt: str) -> st.SearchStrategy[str]:
    """A header, mostly the format's own, and lines, mostly of plausible fields, else arbitrary text."""
    header, columns = FUZZ[fmt]
    if header:
        row = st.tuples(*(mostly(v, JUNK_FIELD) for v in columns.values())).map(",".join)
    else:
        row = st.fixed_dictionaries({k: mostly(v, JSON_VALUE) for k, v in columns.items()}).map(json.dumps)
    junk = st.text(max_size=20) | JSON_VALUE.map(json.dumps)
    lines = st.lists(mostly(row, junk), max_size=6)
    return st.tuples(mostly(st.just(header), st.text(max_size=20).map(lambda t: t + "\n")), lines).map(
        lambda parts: parts[0] + "\n".join(parts[1])
    )


def _read_or_format_error(path: Path, fmt: str | None) -> None:
    try:
        trace = read_trace(path, fmt)
    except TraceFormatError as e:
        assert str(e).startswith(str(path))
    else:
        assert_valid(trace)
        assert fmt is None or trace.format == fmt


@pytest.mark.parametrize("fmt", sorted(FUZZ))
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_lines_under_a_header_read_or_raise_format_error(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, data: st.DataObject
) -> None:
    path = tmp_path_factory.getbasetemp() / ("fuzz.csv" if FUZZ[fmt][0] else "fuzz.jsonl")
    path.write_text(data.draw(fuzz_file(fmt)))
    _read_or_format_error(path, None)
    _read_or_format_error(path, fmt)


@pytest.mark.parametrize("extension", [".csv", ".jsonl", ""])
@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=200))
def test_any_bytes_read_or_raise_format_error(
    tmp_path_factory: pytest.TempPathFactory, extension: str, content: bytes
) -> None:
    path = tmp_path_factory.getbasetemp() / f"bytes{extension}"
    path.write_bytes(content)
    _read_or_format_error(path, None)


# --- transformations ---

BASE = Trace(
    "t.jsonl",
    "native",
    "0" * 64,
    (TraceRequest(0.0, 10, 5), TraceRequest(1.0, 20, 6), TraceRequest(2.5, 30, 7), TraceRequest(4.0, 40, 8)),
)


def test_window_keeps_half_open_interval_and_rebases() -> None:
    out = window(BASE, 1.0, 4.0)
    assert out.requests == (TraceRequest(0.0, 20, 6), TraceRequest(1.5, 30, 7))
    assert out.transformations == (Transformation("window", {"start_s": 1.0, "end_s": 4.0}, 2),)
    assert BASE.transformations == ()
    with pytest.raises(TunerError, match=r"window\(start_s=5, end_s=9\) leaves no requests"):
        window(BASE, 5, 9)


def test_scale_rate_divides_arrivals() -> None:
    out = scale_rate(BASE, 2)
    assert [r.arrival_s for r in out.requests] == [0.0, 0.5, 1.25, 2.0]
    assert [r.input_tokens for r in out.requests] == [10, 20, 30, 40]
    assert out.transformations == (Transformation("rate_scale", {"factor": 2}, 3),)
    assert scale_rate(BASE, 1).transformations[-1].affected == 0
    for factor in (0, -1, math.inf, math.nan):
        with pytest.raises(TunerError, match="positive number"):
            scale_rate(BASE, factor)


def test_cap_requests_keeps_the_first_n() -> None:
    out = cap_requests(BASE, 2)
    assert out.requests == BASE.requests[:2]
    assert out.transformations == (Transformation("max_requests", {"n": 2}, 2),)
    assert cap_requests(BASE, 10).requests == BASE.requests
    assert cap_requests(BASE, 10).transformations[-1].affected == 0
    with pytest.raises(TunerError, match="leaves no requests"):
        cap_requests(BASE, 0)


BUCKETED = Trace(
    "t.jsonl",
    "mooncake",
    "0" * 64,
    tuple(TraceRequest(t, 10, 5) for t in (0.0, 0.0, 0.0, 3.0, 6.0, 6.0, 10.0, 10.0)),
)


def test_spread_moves_each_bucket_evenly_up_to_the_next_arrival() -> None:
    out = spread_buckets(BUCKETED)
    # Intervals 3, 3, 4; the last bucket takes their median, 3.
    assert [r.arrival_s for r in out.requests] == [0.0, 1.0, 2.0, 3.0, 6.0, 8.0, 10.0, 11.5]
    assert out.transformations == (Transformation("spread", {"last_interval_s": 3.0}, 4),)
    assert [r.input_tokens for r in out.requests] == [10] * 8
    # A trace without shared arrivals is left as it is; so is one of a single instant.
    assert spread_buckets(BASE).requests == BASE.requests
    single = spread_buckets(Trace("t", "native", "0" * 64, (TraceRequest(0.0, 1, 1),) * 3))
    assert [r.arrival_s for r in single.requests] == [0.0, 0.0, 0.0]


def test_spread_keeps_the_mooncake_trace_sorted_and_within_its_buckets() -> None:
    bucketed = read_trace(TRACES / "mooncake_conversation_trace.jsonl")
    spread = load_trace(TRACES / "mooncake_conversation_trace.jsonl", TraceSelection(spread=True, max_requests=60))
    arrivals = [r.arrival_s for r in spread.requests]
    assert arrivals == sorted(arrivals)
    assert len(set(arrivals)) == 60  # no two requests in one instant
    for a, b in zip(bucketed.requests, spread.requests):
        assert a.arrival_s <= b.arrival_s < a.arrival_s + 3.1  # never past the next bucket (3 s apart)
        assert (a.input_tokens, a.prefix_blocks) == (b.input_tokens, b.prefix_blocks)
    assert [t.kind for t in spread.transformations] == ["spread", "max_requests"]
    assert trace_stats(spread).gap_cv < trace_stats(cap_requests(bucketed, 60)).gap_cv / 3


def test_transformations_chain_in_order() -> None:
    out = cap_requests(scale_rate(window(BASE, 1.0, 10.0), 0.5), 2)
    assert [t.kind for t in out.transformations] == ["window", "rate_scale", "max_requests"]
    assert [r.arrival_s for r in out.requests] == [0.0, 3.0]
    assert out.transformations[0].describe() == "window(start_s=1.0, end_s=10.0): 1 requests affected"


LONG = Trace(
    "t.jsonl",
    "native",
    "0" * 64,
    (
        TraceRequest(0.0, 3000, 100, (1, 2, 3, 4, 5, 6)),
        TraceRequest(1.0, 600, 2500, (7, 8)),
        TraceRequest(2.0, 1000, 1000, (9, 10)),
    ),
)


def test_fit_clip_shortens_input_and_keeps_partial_blocks() -> None:
    out = fit_to_context(LONG, 2000, "clip")
    assert out.requests == (
        TraceRequest(0.0, 1900, 100, (1, 2, 3, 4)),  # 1900 tokens reach into the 4th 512-token block
        TraceRequest(1.0, 1, 1999, (7,)),  # the output alone was too long
        TraceRequest(2.0, 1000, 1000, (9, 10)),  # fits exactly: unchanged
    )
    assert out.transformations == (
        Transformation(
            "fit_clip",
            {"max_model_len": 2000, "mode": "clip", "input_tokens_removed": 1699, "output_tokens_removed": 501},
            2,
        ),
    )


def test_a_fitted_trace_says_how_many_of_its_requests_were_fitted() -> None:
    assert LONG.fit is None
    clipped = fit_to_context(LONG, 2000, "clip")
    assert clipped.fit == TraceFit("clip", 2000, 3, 2)
    assert clipped.fit.describe() == "2 of 3 requests (67%) clipped to max_model_len 2000"
    assert clipped.whole_share == pytest.approx(1 / 3) and LONG.whole_share == 1.0
    assert fit_to_context(LONG, 2000, "scale").whole_share == 1.0  # a workload chosen whole: nothing refused
    assert TrialTrace.of(clipped).fit == clipped.fit
    assert fit_to_context(LONG, 8000, "scale").fit == TraceFit("scale", 8000, 3, 0)  # fitted as it was


def test_fit_scale_multiplies_every_request_by_one_factor() -> None:
    out = fit_to_context(LONG, 2000, "scale")
    # f = 2000 / 3100: 3000 -> 1935, 100 -> 64, 600 -> 387, 2500 -> 1612, 1000 -> 645, rounded down.
    assert out.requests == (
        TraceRequest(0.0, 1935, 64, (1, 2, 3, 4)),
        TraceRequest(1.0, 387, 1612, (7,)),
        TraceRequest(2.0, 645, 645, (9, 10)),
    )
    step = out.transformations[-1]
    assert (step.kind, step.affected) == ("fit_scale", 3)
    assert step.params == {
        "max_model_len": 2000,
        "mode": "scale",
        "factor": 2000 / 3100,
        "input_tokens_removed": 1633,
        "output_tokens_removed": 1279,
    }


def test_fit_scale_keeps_at_least_one_token_and_leaves_fitting_traces_alone() -> None:
    tiny = Trace("t", "native", "", (TraceRequest(0.0, 1, 99), TraceRequest(1.0, 50, 50)))
    assert fit_to_context(tiny, 10, "scale").requests == (TraceRequest(0.0, 1, 9), TraceRequest(1.0, 5, 5))
    same = fit_to_context(BASE, 48, "scale")
    assert same.requests == BASE.requests
    assert same.transformations[-1].params["factor"] == 1.0
    assert same.transformations[-1].affected == 0


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 10**6), st.integers(1, 10**6)), min_size=1, max_size=8),
    max_model_len=st.integers(2, 10**5),
    mode=st.sampled_from(["clip", "scale"]),
)
def test_fit_always_fits(lengths: list[tuple[int, int]], max_model_len: int, mode: str) -> None:
    trace = Trace("t", "native", "", tuple(TraceRequest(float(i), a, b, (1, 2, 3)) for i, (a, b) in enumerate(lengths)))
    out = fit_to_context(trace, max_model_len, mode)
    assert len(out.requests) == len(trace.requests)
    for before, after in zip(trace.requests, out.requests):
        assert after.input_tokens >= 1 and after.output_tokens >= 1
        assert after.input_tokens + after.output_tokens <= max_model_len
        assert after.input_tokens <= before.input_tokens and after.output_tokens <= before.output_tokens
        if after.input_tokens != before.input_tokens:
            assert len(after.prefix_blocks) == min(3, -(-after.input_tokens // 512))
    step = out.transformations[-1]
    removed = sum(a.input_tokens - b.input_tokens for a, b in zip(trace.requests, out.requests))
    assert step.params["input_tokens_removed"] == removed


def test_fit_rejects_bad_arguments_and_empty_traces() -> None:
    with pytest.raises(TunerError, match="at least 2"):
        fit_to_context(BASE, 1, "clip")
    with pytest.raises(TunerError, match="unknown fit mode 'squash'"):
        fit_to_context(BASE, 100, "squash")
    empty = Trace("t", "native", "", ())
    with pytest.raises(TunerError, match=r"fit_clip\(.*\) leaves no requests"):
        fit_to_context(empty, 100, "clip")


# --- statistics ---


def test_stats_of_a_small_trace() -> None:
    trace = Trace(
        "t",
        "native",
        "",
        (
            TraceRequest(0.0, 10, 1, (1, 2)),
            TraceRequest(1.0, 20, 2, (1, 3)),
            TraceRequest(3.0, 40, 3, (1, 2, 4)),
            TraceRequest(3.0, 30, 4),
        ),
    )
    stats = trace_stats(trace)
    assert (stats.requests, stats.span_s, stats.rate_rps) == (4, 3.0, 4 / 3)
    # gaps 1, 2, 0: mean 1, population stdev sqrt(2/3)
    assert stats.gap_cv == pytest.approx(math.sqrt(2 / 3))
    assert (stats.input_p50, stats.input_p95, stats.input_p99) == pytest.approx((25, 38.5, 39.7))
    assert (stats.output_p50, stats.output_p95, stats.output_p99) == pytest.approx((2.5, 3.85, 3.97))
    assert stats.prefix_block_share == 3 / 7
    assert stats.to_dict()["input_p95"] == stats.input_p95
    assert list(stats.to_dict()) == [
        "requests", "span_s", "rate_rps", "gap_cv", "input_p50", "input_p95", "input_p99",
        "output_p50", "output_p95", "output_p99", "prefix_block_share",
    ]


def test_stats_of_one_request_and_of_none() -> None:
    stats = trace_stats(Trace("t", "native", "", (TraceRequest(0.0, 7, 3),)))
    assert (stats.rate_rps, stats.gap_cv, stats.prefix_block_share) == (0.0, 0.0, 0.0)
    assert (stats.input_p50, stats.input_p99, stats.output_p95) == (7, 7, 3)
    with pytest.raises(TunerError, match="no requests"):
        trace_stats(Trace("t", "native", "", ()))


def test_typical_reuse_window_is_the_median_window_and_its_options_replay_it() -> None:
    # Windows of 2 requests, one per distinct first arrival (0, 1, 2, 3): blocks repeated in them 0, 1/2, 1/4, 1/4;
    # the median is 1/4, first met by the window at 2.
    blocks = [(1, 2), (3, 4), (3, 4), (5, 6), (5, 7), (7, 10)]
    trace = Trace("t.jsonl", "mooncake", "0" * 64,
                  tuple(TraceRequest(t, 10, 5, b) for t, b in zip((0.0, 1.0, 1.0, 2.0, 3.0, 3.0), blocks)))
    found = typical_reuse_window(trace, 2)
    assert (found.windows, found.start_s, found.share) == (4, 2.0, 0.25)
    assert found.trace_share == pytest.approx(4 / 12)
    assert found.share_p10 < found.share < found.share_p90
    replayed = cap_requests(window(trace, found.start_s, math.inf), found.requests)
    assert trace_stats(replayed).prefix_block_share == found.share


def test_the_typical_window_replays_the_same_requests_spread_or_bucketed(tmp_path) -> None:
    # Mooncake's instants of about 3 s: a window found on the recorded clock starts at one, which spreading keeps,
    # so --spread changes when the window's requests arrive, never which they are.
    path = tmp_path / "buckets.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 3000 * (i // 4), "input_length": 100 + i, "output_length": 5,
                                        "hash_ids": [i % 3, 10 + i]}) + "\n" for i in range(40)))
    found = typical_reuse_window(load_trace(path, TraceSelection()), 9)
    chosen = [TraceSelection(window_s=(found.start_s, math.inf), max_requests=9, spread=s) for s in (False, True)]
    bucketed, spread = (load_trace(path, c) for c in chosen)
    assert [r.input_tokens for r in bucketed.requests] == [r.input_tokens for r in spread.requests]
    assert len({r.arrival_s for r in spread.requests}) == 9 > len({r.arrival_s for r in bucketed.requests})


def test_typical_reuse_window_refuses_traces_without_blocks_and_windows_too_long() -> None:
    with pytest.raises(TunerError, match="records no prefix blocks"):
        typical_reuse_window(BASE, 2)
    with_blocks = Trace("t", "mooncake", "0" * 64, (TraceRequest(0.0, 1, 1, (1,)),))
    with pytest.raises(TunerError, match="a window of 2 requests does not fit a trace of 1"):
        typical_reuse_window(with_blocks, 2)


def test_a_selection_keeps_its_spread_through_storage_and_reads_older_ones_without_it() -> None:
    selection = TraceSelection(window_s=(0.0, 60.0), max_requests=8, spread=True)
    assert TraceSelection.from_dict(json.loads(json.dumps(selection.to_dict()))) == selection
    stored_before = {"window_s": [0.0, 60.0], "max_requests": 8, "rate_scale": None, "fit": None}
    assert TraceSelection.from_dict(stored_before) == TraceSelection(window_s=(0.0, 60.0), max_requests=8)
