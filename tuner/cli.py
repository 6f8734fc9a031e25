"""The `tuner` command line: tables for people, --json for programs, exit 2 for bad usage."""

from __future__ import annotations

import signal
import tempfile
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from tuner.console import err, fmt, out, print_json, progress_bar
from tuner.errors import TunerError
from tuner.report_cli import compare, study_report
from tuner.schedule_cli import schedule_app
from tuner.service_cli import serve
from tuner.study_cli import dashboard, study_app

app = typer.Typer(help="Find the vLLM engine settings that serve your own traffic best, by measuring them.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
model_app = typer.Typer(help="Models that need no download.", no_args_is_help=True)
trace_app = typer.Typer(help="Recorded request traces.", no_args_is_help=True)
trial_app = typer.Typer(help="One engine configuration, launched and measured.", no_args_is_help=True)
space_app = typer.Typer(help="Search spaces.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(trace_app, name="trace")
app.add_typer(trial_app, name="trial")
app.add_typer(space_app, name="space")
app.add_typer(study_app, name="study")
app.add_typer(schedule_app, name="schedule")
app.command("dashboard")(dashboard)
study_app.command("report")(study_report)
app.command("compare")(compare)
app.command("serve")(serve)



# --- models -------------------------------------------------------------------------------------------


@model_app.command("tiny")
def model_tiny(folder: Annotated[Path, typer.Argument(help="Where to write the model.")],
               seed: Annotated[int, typer.Option(help="Seed of the random weights and tokenizer corpus.")] = 0) -> None:
    """Write a tiny Llama-architecture model with random weights and a locally trained tokenizer."""
    from tuner.models import write_tiny_model

    with out.status("writing tiny model"):
        write_tiny_model(folder, seed)
    out.print(f"tiny model written to {folder}")


@model_app.command("arch")
def model_arch(name: Annotated[str, typer.Argument(help="A shipped architecture, see `tuner model list`.")],
               folder: Annotated[Path, typer.Argument(help="Where to write its config.json.")]) -> None:
    """Write a config-only real architecture, served with --load-format dummy (random weights, real shape)."""
    from tuner.models import write_architecture

    write_architecture(name, folder)
    out.print(f"{name} config written to {folder} (served with --load-format dummy)")


@model_app.command("list")
def model_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """The config-only architectures that ship with tuner."""
    from tuner.models import inspect_model, shipped_architectures, write_architecture

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in shipped_architectures():
            info = inspect_model(write_architecture(name, Path(tmp) / name))
            rows.append({"name": name, "architecture": info.architecture, "vocab_size": info.vocab_size,
                         "max_position_embeddings": info.max_position_embeddings,
                         "kv_bytes_per_token": info.kv_bytes_per_token})
    if as_json:
        return print_json(rows)
    table = Table("name", "architecture", "vocab", "max positions", "KV KiB/token")
    for r in rows:
        table.add_row(r["name"], r["architecture"], str(r["vocab_size"]), str(r["max_position_embeddings"]),
                      f"{r['kv_bytes_per_token'] / 1024:g}")
    out.print(table)


# --- traces -------------------------------------------------------------------------------------------

FormatOption = Annotated[Optional[str], typer.Option("--format", help="azure, mooncake, burstgpt or native; "
                                                                     "detected when left out.")]
WindowOption = Annotated[Optional[str], typer.Option(help="START:END seconds of the trace to keep.")]
RateOption = Annotated[Optional[float], typer.Option(help="Multiply the arrival rate (2 = twice as fast).")]
CapOption = Annotated[Optional[int], typer.Option(help="Keep the first N requests (after the window).")]
FitOption = Annotated[Optional[str], typer.Option(help="clip or scale lengths to fit max_model_len.")]


@trace_app.command("inspect")
def trace_inspect(file: Annotated[Path, typer.Argument(help="A trace file.")], format: FormatOption = None,
                  window: WindowOption = None, rate_scale: RateOption = None, max_requests: CapOption = None,
                  fit: FitOption = None,
                  max_model_len: Annotated[Optional[int], typer.Option(help="Context to fit lengths to.")] = None,
                  as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Count, span, rate, burstiness and length percentiles of a trace (after any selection)."""
    from tuner.traces.selection import TraceSelection, load_trace
    from tuner.traces.stats import trace_stats

    selection = TraceSelection.from_options(window, max_requests, rate_scale, fit)
    trace = load_trace(file, selection, max_model_len, format)
    stats = trace_stats(trace)
    if as_json:
        return print_json({"source": str(file), "format": trace.format, "sha256": trace.sha256,
                            **stats.to_dict(), "transformations": [t.describe() for t in trace.transformations]})
    table = Table(title=f"{file} ({trace.format}, sha256 {trace.sha256[:12]})", show_header=False)
    table.add_row("requests", str(stats.requests))
    table.add_row("span", f"{stats.span_s:.1f} s")
    table.add_row("rate", f"{stats.rate_rps:.3f} req/s")
    table.add_row("CV of inter-arrival gaps", f"{stats.gap_cv:.2f}")
    table.add_row("input tokens p50 / p95 / p99", f"{stats.input_p50:g} / {stats.input_p95:g} / {stats.input_p99:g}")
    table.add_row("output tokens p50 / p95 / p99",
                  f"{stats.output_p50:g} / {stats.output_p95:g} / {stats.output_p99:g}")
    if stats.prefix_block_share:
        table.add_row("repeated prefix blocks", f"{stats.prefix_block_share:.1%}")
    for step in trace.transformations:
        table.add_row("transformation", step.describe())
    out.print(table)


# --- search spaces ------------------------------------------------------------------------------------


@space_app.command("suggest")
def space_suggest(
    model: Annotated[Optional[Path], typer.Option(help="Model folder; default: the tiny model.")] = None,
    trace: Annotated[Optional[Path], typer.Option(help="Trace file; default: the bundled Azure cut.")] = None,
    gpu_memory: Annotated[Optional[float], typer.Option(
        help="One GPU's memory in GiB as nvidia-smi reports it (an H200: 140.4); default: this machine's GPU, "
             "or its RAM for the CPU build.")] = None,
    format: FormatOption = None, window: WindowOption = None, rate_scale: RateOption = None,
    max_requests: CapOption = None, fit: FitOption = None,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write the space's YAML here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: the ranges and the space's text.")] = False,
) -> None:
    """Derive a search space from the model, the GPU (or this machine) and the trace, with the reason for every
    range; `tuner study create --space auto` derives and stores the same."""
    from tuner.search_spaces.derive import derive_space
    from tuner.hardware import detect_hardware
    from tuner.kv_budget import DeviceMemory, read_model_memory
    from tuner.models import default_model
    from tuner.paths import bundled_trace
    from tuner.traces.selection import TraceSelection, load_trace

    if gpu_memory is not None and gpu_memory <= 0:
        raise TunerError(f"--gpu-memory must be above 0 GiB, got {gpu_memory:g}")
    device = DeviceMemory.of("cuda", gpu_memory) if gpu_memory is not None else DeviceMemory.of_machine(
        detect_hardware())
    selection = TraceSelection.from_options(window, max_requests, rate_scale, fit)
    loaded = load_trace(trace or bundled_trace(), selection, format=format)
    derived = derive_space(read_model_memory(model or default_model()), device, loaded, selection.fit)
    if out_file is not None:
        out_file.write_text(derived.space.text)
    if as_json:
        return print_json(derived.to_dict())
    table = Table("setting", "values", "reason", title=derived.space.description)
    for derived_range in derived.ranges:
        table.add_row(derived_range.setting, derived_range.values, derived_range.reason)
    out.print(table)
    if out_file is not None:
        out.print(f"space written to {out_file}")


# --- trials -------------------------------------------------------------------------------------------


def _trial_table(record) -> Table:
    m = record.measurement
    table = Table(title="trial", show_header=False)
    table.add_row("command", Text(record.serve_command))
    table.add_row("hardware", record.hardware.describe())
    table.add_row("vLLM", record.vllm_version)
    table.add_row("trace", Text(f"{record.trace['source']} ({record.trace['requests']} requests, "
                                f"{record.trace['span_s']:.1f} s)"))
    for step in record.trace["transformations"]:
        table.add_row("", step)
    t = record.timings
    table.add_row("time", f"startup {t.startup_s:.1f} s, replay {t.replay_s:.1f} s, teardown {t.teardown_s:.1f} s")
    if record.failure is not None:
        f = record.failure
        table.add_row(Text("failure", style="red"), Text.assemble((f.kind.value, "red"), f": {f.message}"))
        if f.estimated_max_model_len is not None:
            table.add_row("estimated max model len", str(f.estimated_max_model_len))
    if m is not None:
        table.add_row("completed / requests", f"{m.completed} / {m.requests}  {m.outcomes}")
        table.add_row("completed req/s", fmt(m.completed_rps))
        table.add_row("output tok/s", fmt(m.output_tps, 1))
        table.add_row("TTFT p50 / p95 / p99 s", " / ".join(fmt(v) for v in (m.ttft_s.p50, m.ttft_s.p95, m.ttft_s.p99)))
        table.add_row("e2e p50 / p95 / p99 s", " / ".join(fmt(v) for v in (m.e2e_s.p50, m.e2e_s.p95, m.e2e_s.p99)))
        table.add_row("queue p50 / p95 s", f"{fmt(m.queue_s_p50)} / {fmt(m.queue_s_p95)}")
        table.add_row("preemptions", f"{m.preemptions} ({m.preemptions_per_100:.1f} per 100 requests)")
        table.add_row("running peak / mean", f"{m.running_peak:g} / {m.running_mean:.1f}")
        table.add_row("waiting peak / mean", f"{m.waiting_peak:g} / {m.waiting_mean:.1f}")
        table.add_row("KV usage peak", f"{m.kv_usage_peak:.1%}")
        table.add_row("output tokens requested / actual", f"{m.requested_output_tokens} / {m.actual_output_tokens}")
        table.add_row("send lateness p99 ms", fmt((m.send_lateness_s.p99 or 0) * 1000, 2))
    table.add_row("server log", Text(record.log_path))
    return table


@trial_app.command("run")
def trial_run(
    model: Annotated[Optional[Path], typer.Option(
        help="Model folder (weights, or a config.json alone for dummy weights); default: the tiny model.")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        help="Trace file to replay; default: the bundled cut of the Azure 2023 conversation trace.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Engine setting NAME=VALUE (repeatable).")] = [],
    engine_arg: Annotated[list[str], typer.Option(help="Extra vLLM flag passed as is (repeatable).")] = [],
    format: FormatOption = None, window: WindowOption = None, rate_scale: RateOption = None,
    max_requests: CapOption = None, fit: FitOption = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Folder for the log and records.")] = None,
    startup_timeout: Annotated[float, typer.Option(help="Seconds to wait for a healthy server.")] = 600.0,
    request_timeout: Annotated[float, typer.Option(help="Seconds one request may take.")] = 600.0,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic prompts.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
) -> None:
    """Launch vLLM with one configuration, replay the trace open-loop, and print what users experienced."""
    from tuner.models import default_model, inspect_model
    from tuner.paths import bundled_trace
    from tuner.traces.selection import TraceSelection, load_trace
    from tuner.workers.engine_config import EngineConfig
    from tuner.workers.trial import TrialSpec, run_trial

    config = EngineConfig.from_assignments(set_)
    model = model or default_model()
    trace = trace or bundled_trace()
    info = inspect_model(model)
    loaded = load_trace(trace, TraceSelection.from_options(window, max_requests, rate_scale, fit),
                        config.max_model_len or info.max_position_embeddings, format)
    out_dir = out_dir or Path("runs") / datetime.now().strftime("trial-%Y%m%d-%H%M%S")
    spec = TrialSpec(model=model, trace=loaded, config=config, out_dir=out_dir, startup_timeout_s=startup_timeout,
                     request_timeout_s=request_timeout, extra_args=tuple(engine_arg), seed=seed)
    with progress_bar(as_json) as progress:
        task = progress.add_task("preparing", total=len(loaded.requests))
        outcome = run_trial(spec, on_phase=lambda p: progress.update(task, description=p),
                            on_request_done=lambda _: progress.advance(task))
    record = outcome.record
    if as_json:
        print_json(record.to_dict())
    else:
        out.print(_trial_table(record))
        out.print(f"records: {out_dir}/measurement.json, {out_dir}/requests.csv")
    if record.failure is not None:
        raise typer.Exit(1)


def _stop_on_sigterm(signum, frame) -> None:
    # Turn a polite kill into the same unwinding as Ctrl-C, so every engine is stopped on the way out.
    raise KeyboardInterrupt


# The exceptions of the click typer runs on (its own copy in recent typer): a usage error is one of them.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _print_error(message: str) -> None:
    """One line, always: a line break inside a quoted path or value is shown as \\n."""
    err.print(f"error: {message}".replace("\r", "\\r").replace("\n", "\\n"), highlight=False, soft_wrap=True)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        # Not standalone: a usage error comes here as one line, rather than as typer's boxed, wrapped panel.
        code = app(standalone_mode=False)
    except _ClickException as exc:
        if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            _print_error(f"{exc.format_message()}{hint}")
        sys.exit(exc.exit_code)
    except TunerError as exc:
        _print_error(str(exc))
        sys.exit(2)
    except OSError as exc:  # a path given that cannot be written or read: "[Errno 17] File exists: 'x'"
        _print_error(str(exc))
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted: every engine was stopped")
        sys.exit(130)
    # A command's typer.Exit(N) comes back as N; a command that returned normally exits 0.
    sys.exit(code if isinstance(code, int) else 0)
