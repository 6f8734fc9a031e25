"""Bad input of every kind ends in a clear one-line error (exit 2 from the command line), never a traceback, and
loses nothing already stored: the real traces' lines truncated and mutated in every format, search space files
fuzzed, bad command-line values against a stored study, and settings holding shell metacharacters, which are
refused or reach vLLM's argv literally and show shell-quoted in the `vllm serve` command.

tests/unit/test_traces.py fuzzes synthetic lines under each format's header and detection on random bytes, and
tests/unit/test_search_spaces.py lists broken space files one by one; this file covers what they do not."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from itertools import islice
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import AZURE_CONV, FIXED_LOAD, TRACES
from tuner.search_spaces import SearchSpace, SpaceContext, load_space
from checks import assert_valid, mostly
from tuner.common.errors import TraceFormatError, TunerError
from tuner.analysis.scoring import BOUNDARIES
from tuner.traces.readers import READERS, read_trace
from tuner.traces.selection import TraceSelection, load_trace, parse_window
from tuner.workers.engine_config import EngineConfig
from tuner.workers.launch import engine_argv

# --- trace files ------------------------------------------------------------------------------------------

HEAD = 40  # lines of each real trace to cut and mutate: every kind of line occurs within them


def _head(name: str) -> list[str]:
    with open(TRACES / name, newline="") as f:
        return list(islice(f, HEAD))


_MOONCAKE = _head("mooncake_conversation_trace.jsonl")
# Real lines of every format; the native format's are the Mooncake rows, written natively.
REAL_LINES: dict[str, list[str]] = {
    "azure": _head("azure_conv_2023.csv"),
    "burstgpt": _head("burstgpt_1_first400.csv"),
    "mooncake": _MOONCAKE,
    "native": [json.dumps({"arrival_s": row["timestamp"] / 1000, "input_tokens": row["input_length"],
                           "output_tokens": row["output_length"], "prefix_blocks": row["hash_ids"]}) + "\n"
               for row in map(json.loads, _MOONCAKE)],
}
SUFFIX = {"azure": ".csv", "burstgpt": ".csv", "mooncake": ".jsonl", "native": ".jsonl"}
FUZZ_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def physical_lines(content: bytes) -> int:
    """Lines as the readers count them (\\n, \\r\\n or a lone \\r ends one)."""
    return len(re.split(rb"\r\n|\r|\n", content))


def read_or_clear_error(path: Path, content: bytes) -> None:
    """Read `content` detected and as every format: a valid trace, or one line naming the file (and a line in it)."""
    path.write_bytes(content)
    for format in (None, *READERS):
        try:
            trace = read_trace(path, format)
        except TraceFormatError as exc:
            message = str(exc)
            assert "\n" not in message and "\r" not in message, message
            assert message.startswith(f"{path}: " if exc.line is None else f"{path}:{exc.line}: "), message
            assert exc.line is None or 1 <= exc.line <= physical_lines(content), (exc.line, message)
            outcome = "error"
        else:
            assert_valid(trace)
            assert trace.format == (format or trace.format)
            outcome = "valid"
        if format is None:
            # Counted by --hypothesis-show-statistics: the valid/error split of docs/reliability.md.
            event(f"detected: {outcome}")


@st.composite
def truncated_real_lines(draw, format: str) -> bytes:
    """The first k lines of a real trace, the last cut short anywhere (the header, when k is 1)."""
    lines = REAL_LINES[format]
    k = draw(st.integers(1, len(lines)))
    kept = "".join(lines[:k]).encode()
    return kept[: draw(st.integers(len(kept) - len(lines[k - 1]), len(kept)))]


# Bytes that matter to one format or another, besides arbitrary ones.
SIGNIFICANT = st.sampled_from([b",", b'"', b"\n", b"\r", b"{", b"}", b"[", b"]", b":", b"-", b".", b"e999", b"NaN",
                               b"\xff", b"\x00", b"\xc3", b" ", b"9" * 30])


@st.composite
def mutated_real_lines(draw, format: str) -> bytes:
    """Real lines with a few bytes inserted, deleted or overwritten, or lines repeated or reordered."""
    lines = REAL_LINES[format]
    data = bytearray("".join(lines[: draw(st.integers(1, len(lines)))]).encode())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "delete", "overwrite", "reorder"]))
        if kind == "insert":
            data[at:at] = draw(SIGNIFICANT | st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 12))]
        elif kind == "overwrite" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "reorder":
            rows = bytes(data).splitlines(keepends=True)
            data = bytearray(b"".join(draw(st.permutations(rows)) + draw(st.lists(st.sampled_from(rows), max_size=2))))
    return bytes(data)


@pytest.mark.parametrize("format", sorted(REAL_LINES))
def test_uncut_real_lines_read_as_a_valid_trace_of_their_format(tmp_path, format: str) -> None:
    """The fuzz tests below accept an error as an outcome: a reader refusing everything must still fail here."""
    path = tmp_path / f"uncut{SUFFIX[format]}"
    path.write_text("".join(REAL_LINES[format]))
    for forced in (None, format):
        trace = read_trace(path, forced)
        assert_valid(trace)
        assert trace.format == format and len(trace.requests) >= HEAD - 3, (forced, len(trace.requests))


@pytest.mark.parametrize("format", sorted(REAL_LINES))
@FUZZ_SETTINGS
@given(data=st.data())
def test_real_lines_cut_short_read_or_name_file_and_line(tmp_path, format: str, data) -> None:
    read_or_clear_error(tmp_path / f"cut{SUFFIX[format]}", data.draw(truncated_real_lines(format)))


@pytest.mark.parametrize("format", sorted(REAL_LINES))
@FUZZ_SETTINGS
@given(data=st.data())
def test_real_lines_mutated_read_or_name_file_and_line(tmp_path, format: str, data) -> None:
    read_or_clear_error(tmp_path / f"mutated{SUFFIX[format]}", data.draw(mutated_real_lines(format)))


@FUZZ_SETTINGS
@given(content=st.binary(max_size=300))
def test_random_bytes_read_as_each_format_or_name_file_and_line(tmp_path, content: bytes) -> None:
    read_or_clear_error(tmp_path / "bytes.trace", content)


SELECTIONS = st.fixed_dictionaries({
    "window": mostly(st.tuples(st.floats(-10, 200), st.floats(-10, 400)).map(lambda w: f"{w[0]}:{w[1]}"),
                     st.text(max_size=8) | st.sampled_from(["nan:5", "inf:", "-inf:5", ":nan", "1e400:", "5:5"])),
    "max_requests": st.none() | st.integers(-3, 50),
    "rate_scale": st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e-320, 5e-324, 1e308]),
    "fit": st.sampled_from([None, "clip", "scale", "crop", ""]),
    "max_model_len": st.none() | st.integers(-3, 10**30),
})


@FUZZ_SETTINGS
@given(choice=SELECTIONS)
def test_any_selection_of_a_real_trace_gives_a_valid_trace_or_a_clear_error(choice: dict) -> None:
    """--window, --max-requests, --rate-scale, --fit and a context, in any combination, on the real Azure lines."""
    path = TRACES / "azure_conv_2023.csv"
    try:
        selection = TraceSelection(window_s=parse_window(choice["window"]), max_requests=choice["max_requests"],
                                   rate_scale=choice["rate_scale"], fit=choice["fit"])
        trace = load_trace(path, selection, choice["max_model_len"])
    except TunerError as exc:
        assert str(exc).strip() and "\n" not in str(exc)
    else:
        assert_valid(trace)
        if selection.fit is not None and choice["max_model_len"] is not None:
            assert all(r.input_tokens + r.output_tokens <= choice["max_model_len"] for r in trace.requests)


# --- search space files -----------------------------------------------------------------------------------

FIELDS = [name for name in EngineConfig.__dataclass_fields__]
JUNK = (st.none() | st.booleans() | st.integers(-3, 10**40) | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=6) | st.lists(st.integers(), max_size=2)
        | st.sampled_from(["$(touch x)", "a;b", "`id`", "x\ny"]))
ODD_KEYS = st.text(max_size=8) | st.sampled_from(["served_model_name", "1", "a\nb", "x\ry", "$(id)"])
SETTING_NAME = mostly(st.sampled_from(FIELDS), ODD_KEYS)
VALUE = mostly(st.sampled_from([1, 2, 8, 64, 512, 4096, 0.5, 0.9, True, False, "auto", "bfloat16", "fp8", "float16"]),
               JUNK)
PARAMETER = st.fixed_dictionaries({}, optional={
    "type": mostly(st.sampled_from(["int", "float", "categorical"]), JUNK),
    "low": mostly(st.integers(1, 64) | st.floats(0.05, 0.5), JUNK),
    "high": mostly(st.integers(64, 4096) | st.floats(0.5, 1.0), JUNK),
    "step": mostly(st.integers(1, 16) | st.floats(0.01, 0.1) | st.just(5e-324), JUNK),
    "log": mostly(st.booleans(), JUNK),
    "choices": mostly(st.lists(VALUE, max_size=4), JUNK),
}).flatmap(lambda spec: mostly(st.just(spec), st.dictionaries(ODD_KEYS, JUNK, max_size=1).map(lambda d: {**spec, **d})))
COMPARISON = mostly(st.tuples(st.sampled_from(FIELDS), st.sampled_from(["<", "<=", "==", "!=", ">=", ">"]),
                              st.sampled_from(["8", "0.9", "true", "'auto'", "max_model_len", "'x'"])).map(" ".join),
                    st.text(max_size=12) | JUNK)
SPACE_FILE = st.fixed_dictionaries({}, optional={
    "name": mostly(st.text(max_size=8), JUNK),
    "description": mostly(st.text(max_size=8), JUNK),
    "fixed": mostly(st.dictionaries(SETTING_NAME, VALUE, max_size=3), JUNK),
    "parameters": mostly(st.dictionaries(SETTING_NAME, mostly(PARAMETER, JUNK), max_size=3), JUNK),
    "constraints": mostly(st.lists(st.fixed_dictionaries({"require": COMPARISON}, optional={"when": COMPARISON}),
                                   max_size=2), JUNK),
}).flatmap(lambda doc: mostly(st.just(doc), st.dictionaries(ODD_KEYS, JUNK, min_size=1, max_size=1).map(
    lambda odd: {**doc, **odd})))
CONTEXT = SpaceContext("cpu", longest_request_tokens=4000, fit="clip", model_max_len=4096)


def load_or_clear_error(path: Path, text: str) -> SearchSpace | None:
    path.write_text(text)
    try:
        return load_space(path)
    except TunerError as exc:
        message = str(exc)
        assert message.startswith(f"{path}: ") and "\n" not in message and "\r" not in message, message
        return None


@FUZZ_SETTINGS
@given(document=SPACE_FILE)
def test_any_space_file_loads_and_proposes_or_names_file_and_key(tmp_path, document: dict) -> None:
    """Every space that loads also proposes configurations Optuna accepts, each judged without an exception."""
    space = load_or_clear_error(tmp_path / "space.yaml", yaml.safe_dump(document, allow_unicode=True))
    if space is None:
        return
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))
    for config in (space.baseline(), *(space.suggest(study.ask()) for _ in range(3))):
        assert all(isinstance(r, str) and "\n" not in r for r in space.violations(config, CONTEXT))


@FUZZ_SETTINGS
@given(text=st.text(max_size=200))
def test_any_text_as_a_space_file_loads_or_names_the_file(tmp_path, text: str) -> None:
    load_or_clear_error(tmp_path / "text.yaml", text)


TINY_STEP_SPACE = "parameters:\n  gpu_memory_utilization: {type: float, low: 0.1, high: 0.9, step: 5.0e-324}\n"


@pytest.mark.parametrize("text, expected", [
    ("parameters: " + "[" * 5000 + "]" * 5000 + "\n", "invalid YAML: nested too deeply"),
    (TINY_STEP_SPACE, "parameters.gpu_memory_utilization.step: 5e-324 is too small for the range 0.1 to 0.9"),
    ("fixed:\n  \"a\\nb\": 1\n", "'fixed.a\\nb': unknown engine setting; known: " + ", ".join(FIELDS)),
])
def test_the_space_files_fuzzing_found_are_refused_clearly(tmp_path, text: str, expected: str) -> None:
    """The first two ended in a traceback (RecursionError, OverflowError), the third in a message of two lines,
    before they were fixed."""
    path = tmp_path / "found.yaml"
    path.write_text(text)
    with pytest.raises(TunerError) as caught:
        load_space(path)
    assert str(caught.value) == f"{path}: {expected}"


# --- the command line -------------------------------------------------------------------------------------


def tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=120)


def assert_refused(result: subprocess.CompletedProcess, expected: str) -> None:
    """Exit 2, nothing on stdout, and one line on stderr, an error message, no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0], lines[0]
    assert result.stdout == ""


AZURE_LINES = "".join(REAL_LINES["azure"][:3])
# (name, file content or None for no file, extra arguments, expected text with {path} for the file)
BAD_TRACES = [
    ("missing", None, [], "{path}: cannot read the file: No such file or directory"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00", [], "{path}:1: not UTF-8 text"),
    ("cut-azure", AZURE_LINES[:-20].encode(), [], "{path}:3: 1 fields, the header has 3"),
    ("cut-mooncake", "".join(_MOONCAKE[:2])[:-30].encode(), [], "{path}:2: not valid JSON"),
    ("unknown-header", b"time,in,out\n1,2,3\n", [], "{path}:1: unknown trace format"),
    ("empty", b"", [], "{path}: empty file"),
    ("format-unknown", AZURE_LINES.encode(), ["--format", "parquet"], "unknown trace format 'parquet'"),
    ("window-text", AZURE_LINES.encode(), ["--window", "abc"], "window must be START:END in seconds, got 'abc'"),
    ("window-backwards", AZURE_LINES.encode(), ["--window", "9:3"], "window end must be after its start"),
    ("window-nan", AZURE_LINES.encode(), ["--window", "nan:5"], "window must be START:END in seconds"),
    ("rate-negative", AZURE_LINES.encode(), ["--rate-scale", "-1"], "rate scale factor must be a positive number"),
    ("rate-tiny", AZURE_LINES.encode(), ["--rate-scale", "1e-320"], "arrival times overflow"),
    ("rate-text", AZURE_LINES.encode(), ["--rate-scale", "fast"], "Invalid value for '--rate-scale'"),
    ("max-requests-0", AZURE_LINES.encode(), ["--max-requests", "0"], "max_requests must be at least 1, got 0"),
    ("fit-crop", AZURE_LINES.encode(), ["--fit", "crop"], "fit must be one of clip, scale, got 'crop'"),
    ("fit-context-1", AZURE_LINES.encode(), ["--fit", "clip", "--max-model-len", "1"],
     "max_model_len must be at least 2"),
]


@pytest.mark.parametrize("name, content, extra, expected", BAD_TRACES, ids=[c[0] for c in BAD_TRACES])
def test_trace_inspect_of_a_bad_file_or_selection_exits_2_with_one_line(tmp_path, name, content, extra, expected):
    # A path holding a closing markup tag, [/x]: the message names the file as given.
    path = tmp_path / "bad [" / f"x] {name}.csv"
    path.parent.mkdir()
    if content is not None:
        path.write_bytes(content)
    assert_refused(tuner("trace", "inspect", str(path), *extra), expected.format(path=path))


def test_trace_window_refuses_a_trace_without_blocks_and_a_window_too_long(tmp_path) -> None:
    azure, mooncake = tmp_path / "azure.csv", tmp_path / "mooncake.jsonl"
    azure.write_text(AZURE_LINES)
    mooncake.write_text("".join(_MOONCAKE[:5]))
    assert_refused(tuner("trace", "window", str(azure)), f"{azure}: the trace records no prefix blocks")
    assert_refused(tuner("trace", "window", str(mooncake), "--requests", "6"),
                   "a window of 6 requests does not fit a trace of 5")


def test_a_line_break_in_a_path_is_shown_escaped_on_the_one_line(tmp_path) -> None:
    path = tmp_path / "two\nlines.csv"
    shown = str(path).replace("\n", "\\n")
    assert_refused(tuner("trace", "inspect", str(path)), f"{shown}: cannot read the file: No such file or directory")


def stored_rows(url: str) -> dict[str, list]:
    """Every row of every table in the database, in a stable order."""
    engine = sa.create_engine(url)
    try:
        metadata = sa.MetaData()
        metadata.reflect(engine)
        with engine.connect() as conn:
            return {name: sorted(map(repr, conn.execute(table.select()))) for name, table in metadata.tables.items()}
    finally:
        engine.dispose()


PWNED = "pwned"  # a file the shell metacharacters below would create if anything ran them through a shell


@pytest.fixture(scope="module")
def stored_study(tmp_path_factory, tiny_model):
    """A study in a real SQLite database, with the baseline and one enqueued configuration waiting."""
    root = tmp_path_factory.mktemp("stored")
    url = f"sqlite:///{root / 'studies.db'}"
    base = ["--model", str(tiny_model), "--trace", str(AZURE_CONV), "--window", "300:400", "--max-requests", "16",
            "--rate-scale", "100", "--fit", "clip", *FIXED_LOAD, "--storage", url]
    assert tuner("study", "create", "keep", *base).returncode == 0
    assert tuner("study", "enqueue", "keep", "--set", "max_num_seqs=4", "--storage", url).returncode == 0
    broken_space = root / "broken.yaml"
    broken_space.write_text(TINY_STEP_SPACE)
    broken_trace = root / "broken.csv"
    broken_trace.write_text(AZURE_LINES[:-20])
    fp8_space = root / "fp8.yaml"  # a valid space that changes numerics: only a study that allows it may search it
    fp8_space.write_text("parameters:\n  kv_cache_dtype: {type: categorical, choices: [auto, fp8]}\n"
                         "  quantization: {type: categorical, choices: [null, fp8]}\n")
    return {"url": url, "base": base, "root": root, "broken_space": str(broken_space),
            "broken_trace": str(broken_trace), "fp8_space": str(fp8_space), "rows": stored_rows(url)}


METACHARS = "$(touch {root}/pwned); rm -rf ~ `touch {root}/pwned` | tee {root}/pwned"
OTHER = ["study", "create", "other", "{base}"]  # a new study, on the stored study's valid options
# (name, arguments after `tuner`, expected text); {...} are filled from the stored study.
BAD_COMMANDS = [
    ("create-duplicate", ["study", "create", "keep", "{base}"], "study keep already exists"),
    ("create-empty-name", ["study", "create", "", "{base}"], "name: String should have at least 1 character"),
    ("create-window-text", [*OTHER, "--window", "abc"], "window must be START:END"),
    ("create-precision-zero", [*OTHER, "--precision", "0"], "precision must be between 0 and 1"),
    ("create-load-range-above-reference", [*OTHER, "--load-range", "2:8"], "load bounds must hold the reference"),
    ("create-probe-budget-zero", [*OTHER, "--probe-budget", "0"], "probe budget must be at least 1"),
    ("create-probe-seconds-negative", [*OTHER, "--probe-seconds", "-1"], "probe seconds must be at least 0"),
    ("create-probes-too-short", [*OTHER, "--load", "search", "--probe-requests", "32"],
     "needs at least 73 requests a probe"),
    ("create-window-backwards", [*OTHER, "--window", "400:300"], "window end must be after"),
    ("create-rate-negative", [*OTHER, "--rate-scale", "-1"], "must be a positive number"),
    ("create-rate-text", [*OTHER, "--rate-scale", "x"], "Invalid value for '--rate-scale'"),
    ("create-max-requests-0", [*OTHER, "--max-requests", "0"], "max_requests must be at least 1"),
    ("create-fit-crop", [*OTHER, "--fit", "crop"], "fit must be one of clip, scale"),
    ("create-limit-nonsense", [*OTHER, "--limit", "nonsense"], "expected LIMIT=VALUE"),
    ("create-limit-text", [*OTHER, "--limit", "ttft_p95_s=fast"],
     "limit ttft_p95_s expects a number or none"),
    ("create-limit-unknown", [*OTHER, "--limit", "speed=1"], "unknown boundary limit 'speed'"),
    ("create-space-unknown", [*OTHER, "--space", "h100"], "h100: no such search space file"),
    ("create-space-broken", [*OTHER, "--space", "{broken_space}"], "is too small for the range"),
    ("create-boundary", [*OTHER, "--boundary", "fast"], "unknown boundary 'fast'"),
    # FP8 changes the model's numerics: refused where the machine cannot run it, and unless the study allows it.
    ("create-fp8-on-cpu", [*OTHER, "--allow-fp8"], "--allow-fp8: vLLM's CPU build has no FP8 weights or KV cache"),
    ("create-fp8-space-not-allowed", [*OTHER, "--space", "{fp8_space}"],
     "space fp8 searches FP8 (kv_cache_dtype, quantization), which changes the model's numerics: create the study "
     "with --allow-fp8 to search it"),
    ("create-sampler", [*OTHER, "--sampler", "anneal"], "unknown sampler 'anneal'"),
    ("create-seed-text", [*OTHER, "--seed", "x"], "Invalid value for '--seed'"),
    ("create-seed-negative", [*OTHER, "--seed", "-491397"], "seed must be between 0 and"),  # schemathesis found it
    ("create-trace-missing", [*OTHER, "--trace", "{root}/absent.csv"], "cannot read the file"),
    ("create-trace-broken", [*OTHER, "--trace", "{broken_trace}"], "broken.csv:3: 1 fields"),
    ("create-model-missing", [*OTHER, "--model", "{root}/absent"], "not a model folder"),
    ("run-trials-0", ["study", "run", "keep", "--trials", "0"], "Invalid value for '--trials'"),
    ("run-trials-text", ["study", "run", "keep", "--trials", "many"], "Invalid value for '--trials'"),
    ("run-parallel-0", ["study", "run", "keep", "--parallel", "0"], "Invalid value for '--parallel'"),
    ("run-heartbeat-0", ["study", "run", "keep", "--heartbeat", "0"], "Invalid value for '--heartbeat'"),
    ("run-until", ["study", "run", "keep", "--until", "25:99"], "--until expects HH:MM, got '25:99'"),
    ("run-timeout-and-until", ["study", "run", "keep", "--timeout", "60", "--until", "10:00"], "not both"),
    ("run-missing-study", ["study", "run", "absent", "--trials", "1"], "no study named absent"),
    ("run-repeats-1", ["study", "run", "keep", "--repeats", "1"], "Invalid value for '--repeats'"),
    ("validate-missing-study", ["study", "validate", "absent"], "no study named absent"),
    ("validate-top-0", ["study", "validate", "keep", "--top", "0"], "Invalid value for '--top'"),
    ("validate-nothing-feasible", ["study", "validate", "keep"], "no feasible configuration other than vLLM's default"),
    ("enqueue-unknown", ["study", "enqueue", "keep", "--set", "x=y"], "unknown engine setting 'x'"),
    ("enqueue-no-value", ["study", "enqueue", "keep", "--set", "max_num_seqs"], "expected NAME=VALUE"),
    ("enqueue-text", ["study", "enqueue", "keep", "--set", "max_num_seqs=many"], "expects int, got 'many'"),
    ("enqueue-zero", ["study", "enqueue", "keep", "--set", "max_num_seqs=0"], "max_num_seqs must be at least 1"),
    ("enqueue-huge", ["study", "enqueue", "keep", "--set", "max_num_seqs=" + "9" * 300],
     "max_num_seqs must be at most 2147483647, got 1e+300"),
    ("enqueue-share", ["study", "enqueue", "keep", "--set", "gpu_memory_utilization=1.5"], "must be in (0, 1]"),
    ("enqueue-quantization-int3", ["study", "enqueue", "keep", "--set", "quantization=int3"],
     "quantization must be one of fp8"),
    ("enqueue-quantization-not-searched", ["study", "enqueue", "keep", "--set", "quantization=fp8"],
     "quantization is not searched in space cpu-small"),
    ("enqueue-missing-study", ["study", "enqueue", "absent", "--set", "max_num_seqs=2"], "no study named absent"),
    ("enqueue-metachars-name", ["study", "enqueue", "keep", "--set", "served_model_name=" + METACHARS],
     "unknown engine setting 'served_model_name'"),
    ("enqueue-metachars-dtype", ["study", "enqueue", "keep", "--set", "dtype=" + METACHARS], "dtype must be one of"),
    ("export-format", ["study", "export", "keep", "--format", "xml"], "--format must be json or csv, got 'xml'"),
    ("status-missing-study", ["study", "status", "absent"], "no study named absent"),
    ("trial-metachars-kv-dtype", ["trial", "run", "--set", "kv_cache_dtype=" + METACHARS],
     "kv_cache_dtype must be one of"),
    # Paths to write into that are files: refused before any launch, as one line.
    ("trial-out-is-a-file", ["trial", "run", "--out", "{broken_trace}"], "File exists"),
    ("model-tiny-into-a-file", ["model", "tiny", "{broken_trace}"], "File exists"),
    ("model-arch-under-a-file", ["model", "arch", "llama-3.1-8b", "{broken_trace}/x"], "Not a directory"),
]


def _arguments(template: list[str], study: dict) -> list[str]:
    args = []
    for item in template:
        args += study["base"] if item == "{base}" else [item.format(**study)]
    if args[0] == "study" and "{base}" not in template:
        args += ["--storage", study["url"]]
    return args


@pytest.mark.parametrize("name, template, expected", BAD_COMMANDS, ids=[c[0] for c in BAD_COMMANDS])
def test_a_bad_command_exits_2_with_one_line_and_the_stored_study_is_intact(stored_study, name, template, expected):
    assert_refused(tuner(*_arguments(template, stored_study)), expected)
    assert stored_rows(stored_study["url"]) == stored_study["rows"]
    assert not (stored_study["root"] / PWNED).exists()


def test_after_every_bad_command_the_study_still_runs_from_where_it_was(stored_study) -> None:
    status = tuner("study", "status", "keep", "--json", "--storage", stored_study["url"])
    assert status.returncode == 0, status.stderr
    assert len(json.loads(status.stdout)["waiting"]) == 2  # the baseline and the enqueued configuration


@pytest.mark.parametrize("boundary", sorted(BOUNDARIES))
def test_every_documented_boundary_creates_a_study_that_keeps_it(stored_study, tmp_path, boundary) -> None:
    """The stored record once kept a list of names of its own, without long-prompt, and refused it with a
    traceback after every option had been checked."""
    url = f"sqlite:///{tmp_path / 'boundary.db'}"
    created = tuner("study", "create", boundary, *stored_study["base"][:-2], "--boundary", boundary, "--storage", url)
    assert created.returncode == 0, created.stderr
    status = tuner("study", "status", boundary, "--json", "--storage", url)
    assert status.returncode == 0 and json.loads(status.stdout)["boundary"] == boundary, status.stderr


def test_names_and_paths_that_look_like_markup_are_printed_as_given(stored_study, tmp_path) -> None:
    """Rich would read `[bold]` or `[/x]` in a study name as styling (or fail on a stray closing tag)."""
    name = "[bold]nightly[/bold] [/x] [red]"
    url = f"sqlite:///{tmp_path / 'markup.db'}"
    options = [*stored_study["base"][:-2], "--storage", url]
    created = tuner("study", "create", name, *options)
    assert created.returncode == 0, created.stderr
    assert f"study {name} created" in created.stdout
    enqueued = tuner("study", "enqueue", name, "--set", "max_num_seqs=4", "--storage", url)
    assert enqueued.returncode == 0, enqueued.stderr
    assert f"enqueued in study {name}: {{'max_num_seqs': 4}}" in enqueued.stdout
    listed = tuner("study", "list", "--storage", url)
    assert listed.returncode == 0 and "[/x]" in listed.stdout, listed.stdout + listed.stderr
    missing = tuner("study", "status", "[/absent]", "--storage", url)
    assert_refused(missing, "no study named [/absent]")


# --- shell metacharacters ---------------------------------------------------------------------------------

SHELL_TEXT = ["$(touch pwned)", "`touch pwned`", "; touch pwned", "&& rm -rf ~", "| tee pwned", "a' b \"c", "x\ny",
              "${HOME}", "\\", "--flag=$(id)", "[/x] [red]", "*", "~", "#", "'", '"', "", " "]


@pytest.mark.parametrize("text", SHELL_TEXT)
def test_metacharacters_in_a_string_setting_are_refused(tmp_path, text: str) -> None:
    """The only free-text settings are choices from a fixed list; anything else is refused, in --set and in a
    space file's fixed values and categorical choices alike."""
    for setting, expected in (("dtype", "dtype must be one of"), ("kv_cache_dtype", "kv_cache_dtype must be one of"),
                              ("served_model_name", "unknown engine setting 'served_model_name'"),
                              ("max_num_seqs", "max_num_seqs expects int")):
        with pytest.raises(TunerError, match=re.escape(expected)):
            EngineConfig.from_assignments([f"{setting}={text}"])
    for document, key in (({"parameters": {"dtype": {"type": "categorical", "choices": ["auto", text]}}},
                           "parameters.dtype.choices[1]"),
                          ({"fixed": {"kv_cache_dtype": text}}, "fixed.kv_cache_dtype")):
        path = tmp_path / "space.yaml"
        path.write_text(yaml.safe_dump(document))
        with pytest.raises(TunerError) as caught:
            load_space(path)
        assert str(caught.value).startswith(f"{path}: {key}: ")


CONFIGS = st.builds(EngineConfig, max_num_seqs=st.none() | st.integers(1, 512), dtype=st.sampled_from([None, "auto"]),
                    enable_chunked_prefill=st.sampled_from([None, True, False]),
                    gpu_memory_utilization=st.none() | st.floats(0.05, 1.0))


@FUZZ_SETTINGS
@given(config=CONFIGS, model=st.text(min_size=1) | st.sampled_from(SHELL_TEXT[:-2]),
       extra=st.lists(st.text() | st.sampled_from(SHELL_TEXT), max_size=4))
def test_the_serve_command_is_shell_quoted_and_splits_back_to_the_same_argv(config, model: str, extra: list[str]):
    command = config.serve_command(model, extra)
    assert shlex.split(command) == ["vllm", "serve", model, *config.cli_args(), *extra]


def test_a_model_path_and_engine_arguments_with_metacharacters_are_argv_items_as_given(tmp_path, tiny_model):
    model = tmp_path / "m $(touch pwned); `id` 'q' \"d\" [/x]"
    shutil.copytree(tiny_model, model)
    extra = ["--served-model-name", "model", *SHELL_TEXT]
    argv = engine_argv(model, EngineConfig(max_num_seqs=2), 8000, extra)
    assert argv[argv.index("--model") + 1] == str(model)
    assert argv[-len(extra):] == extra


@pytest.mark.vllm
def test_metacharacters_reach_vllm_literally_and_the_recorded_command_quotes_them(tmp_path, tiny_model) -> None:
    """A real trial whose model folder and extra vLLM argument hold shell metacharacters: vLLM is given them as
    they are (its log shows the served name), no shell runs them, and `vllm serve` in the record splits back."""
    # No glob characters (* ? [) in the folder: vLLM finds the weights by globbing inside it.
    model = tmp_path / "m $(touch pwned); 'q' `id`"
    shutil.copytree(tiny_model, model)
    alias = f"$(touch {tmp_path}/pwned); rm -rf ~ `touch {tmp_path}/pwned` | tee {tmp_path}/pwned [/x]"
    out = tmp_path / "trial"
    result = subprocess.run(
        [sys.executable, "-m", "tuner", "trial", "run", "--model", str(model), "--trace", str(AZURE_CONV),
         "--window", "300:400", "--max-requests", "4", "--rate-scale", "100", "--fit", "clip", *FIXED_LOAD,
         "--set", "kv_cache_memory_bytes=268435456", "--set", "enforce_eager=true",
         "--engine-arg=--served-model-name", "--engine-arg=model", f"--engine-arg={alias}", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[/x]" in result.stdout and "Traceback" not in result.stderr  # the table shows it, as text
    record = json.loads((out / "measurement.json").read_text())
    assert record["measurement"]["completed"] == 4  # served under its first name, "model"
    assert shlex.split(record["serve_command"]) == [
        "vllm", "serve", str(model), "--kv-cache-memory-bytes", "268435456", "--enforce-eager",
        "--served-model-name", "model", alias]
    assert alias in (out / "server.log").read_text()
    assert not (tmp_path / "pwned").exists()
