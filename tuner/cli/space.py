"""`tuner space ...`: search spaces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from tuner.cli.options import (CapOption, FitOption, FormatOption, ModelOption, RateOption, SpreadOption, TraceOption,
                               WindowOption, trace_selection)
from tuner.common.console import out, print_json
from tuner.common.errors import TunerError
from tuner.common.hardware import detect_hardware
from tuner.analysis.kv_budget import DeviceMemory, read_model_memory
from tuner.common.models import default_model
from tuner.common.paths import bundled_trace
from tuner.traces.selection import load_trace

space_app = typer.Typer(help="Search spaces.", no_args_is_help=True)


@space_app.command("suggest")
def space_suggest(
    model: ModelOption = None, trace: TraceOption = None,
    gpu_memory: Annotated[Optional[float], typer.Option(
        help="One GPU's memory in GiB as nvidia-smi reports it (an H200: 140.4); default: this machine's GPU, "
             "or its RAM for the CPU build.")] = None,
    format: FormatOption = None, window: WindowOption = None, rate_scale: RateOption = None,
    max_requests: CapOption = None, fit: FitOption = None, spread: SpreadOption = False,
    allow_fp8: Annotated[bool, typer.Option("--allow-fp8", help="Search FP8 weights and KV cache too (they change "
                                                                "the model's numerics); with --gpu-memory, the GPU "
                                                                "is taken to run FP8 (compute capability 8.9 or "
                                                                "later).")] = False,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write the space's YAML here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: the ranges and the space's text.")] = False,
) -> None:
    """Derive a search space from the model, the GPU (or this machine) and the trace, with the reason for every
    range; `tuner study create --space auto` derives and stores the same."""
    # lazy: keeps the CLI's start fast (the search spaces' pydantic models, YAML)
    from tuner.search_spaces.derive import derive_space

    if gpu_memory is not None and gpu_memory <= 0:
        raise TunerError(f"--gpu-memory must be above 0 GiB, got {gpu_memory:g}")
    if gpu_memory is None and allow_fp8 and (unsupported := detect_hardware().fp8_unsupported()):
        raise TunerError(f"--allow-fp8: {unsupported}")
    device = DeviceMemory.of("cuda", gpu_memory) if gpu_memory is not None else DeviceMemory.of_machine(
        detect_hardware())
    selection = trace_selection(window, max_requests, rate_scale, fit, spread)
    loaded = load_trace(trace or bundled_trace(), selection, format=format)
    derived = derive_space(read_model_memory(model or default_model()), device, loaded, selection.fit,
                           fp8=allow_fp8)
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
