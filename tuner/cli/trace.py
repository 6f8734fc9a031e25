"""`tuner trace ...`: recorded request traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from tuner.cli.options import (CapOption, FitOption, FormatOption, JsonOption, RateOption, SpreadOption, WindowOption,
                               trace_selection)
from tuner.common.console import out, print_json
from tuner.traces.selection import TraceSelection, load_trace
from tuner.traces.stats import trace_stats, typical_reuse_window

trace_app = typer.Typer(help="Recorded request traces.", no_args_is_help=True)


@trace_app.command("inspect")
def trace_inspect(file: Annotated[Path, typer.Argument(help="A trace file.")], format: FormatOption = None,
                  window: WindowOption = None, rate_scale: RateOption = None, max_requests: CapOption = None,
                  fit: FitOption = None, spread: SpreadOption = False,
                  max_model_len: Annotated[Optional[int], typer.Option(help="Context to fit lengths to.")] = None,
                  as_json: JsonOption = False) -> None:
    """Count, span, rate, burstiness and length percentiles of a trace (after any selection)."""
    trace = load_trace(file, trace_selection(window, max_requests, rate_scale, fit, spread), max_model_len, format)
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


@trace_app.command("window")
def trace_window(file: Annotated[Path, typer.Argument(help="A trace file with prefix blocks (Mooncake).")],
                 requests: Annotated[int, typer.Option(help="Requests in the window.")] = 300,
                 format: FormatOption = None, spread: SpreadOption = False, as_json: JsonOption = False) -> None:
    """The window of N requests whose prefix reuse is typical of the trace (the median over every such window),
    and the options that replay it."""
    # Found on the recorded clock: it starts at a recorded arrival, which --spread leaves in place while it moves
    # the rest of that instant's requests after it, so the same options replay the same requests with or without it.
    trace = load_trace(file, TraceSelection(), format=format)
    found = typical_reuse_window(trace, requests)
    options = f"{'--spread ' if spread else ''}--window {found.start_s!r}: --max-requests {found.requests}"
    if as_json:
        return print_json({"source": str(file), "sha256": trace.sha256, **found.to_dict(), "options": options})
    table = Table(title=f"{file}: a typical window of {found.requests} requests", show_header=False)
    table.add_row("first arrival", f"{found.start_s:.3f} s")
    table.add_row("repeated prefix blocks in it", f"{found.share:.1%}")
    table.add_row(f"across all {found.windows} windows (p10-p90)", f"{found.share_p10:.1%}-{found.share_p90:.1%}")
    table.add_row("in the whole trace", f"{found.trace_share:.1%} (a trial's cache starts empty: it sees the window's)")
    table.add_row("replay it with", options)
    out.print(table)
