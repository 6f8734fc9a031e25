"""The options and arguments that several commands share, declared once, and what turns their values into the
objects the commands work on (a storage plan, the study answers, a trace selection)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from tuner.analysis.capacity import LoadPolicy
from tuner.study.plan import StoragePlan
from tuner.traces.selection import TraceSelection

if TYPE_CHECKING:
    from tuner.studies import Studies

# --- where studies live -----------------------------------------------------------------------------------

StorageOption = Annotated[Optional[str], typer.Option(
    "--storage", envvar="TUNER_STORAGE", help="Database URL (SQLite file or PostgreSQL); default: a SQLite file "
                                             "in $TUNER_HOME.")]
ArtifactsOption = Annotated[Optional[Path], typer.Option(
    "--artifacts", envvar="TUNER_ARTIFACTS", help="Folder of trial artifacts; default: beside the SQLite file.")]
ServerOption = Annotated[Optional[str], typer.Option(
    "--server", envvar="TUNER_SERVER", help="Ask the tuner service at this URL instead of running here "
                                            "(paths are then read on the service's machine).")]
TokenFileOption = Annotated[Optional[Path], typer.Option(
    "--token-file", help="File holding the service's bearer token; default: $TUNER_API_TOKEN_FILE, else "
                         "$TUNER_API_TOKEN.")]
RayAddressOption = Annotated[Optional[str], typer.Option(
    envvar="RAY_ADDRESS", help="Join this Ray cluster instead of starting a local one.")]
StudyArgument = Annotated[str, typer.Argument(help="The study.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]

# --- one trial's engine and workload ----------------------------------------------------------------------

ServedModelOption = Annotated[Optional[Path], typer.Option(
    help="Model folder (weights, or a config.json alone for dummy weights); default: the tiny model.")]
ReplayedTraceOption = Annotated[Optional[Path], typer.Option(
    help="Trace file to replay; default: the bundled cut of the Azure 2023 conversation trace.")]
SetOption = Annotated[list[str], typer.Option("--set", help="Engine setting NAME=VALUE (repeatable).")]
EngineArgOption = Annotated[list[str], typer.Option(help="Extra vLLM flag passed as is (repeatable).")]
# Named here, not by the parameter: in `study create` the parameter is named as the StudyRequest field it fills.
StartupTimeoutOption = Annotated[float, typer.Option("--startup-timeout", help="Seconds to wait for a healthy server.")]
RequestTimeoutOption = Annotated[float, typer.Option("--request-timeout", help="Seconds one request may take.")]
PromptSeedOption = Annotated[int, typer.Option(help="Seed of the synthetic prompts.")]
BOUNDARY_HELP = ("interactive (p95 TTFT 2 s, p95 end-to-end 30 s), long-prompt (p95 TTFT 0.5 s per 1,000 prompt "
                 "tokens, p95 end-to-end 60 s) or batch (every request served within twice the trace's span)")
BoundaryOption = Annotated[str, typer.Option(help=f"{BOUNDARY_HELP}: the boundary each replay is judged against (in a "
                                                  "load search, what a probe must meet to pass).")]
# Named here, as the timeouts above.
LimitOption = Annotated[list[str], typer.Option("--limit", help="Override a boundary limit, NAME=VALUE or NAME=none "
                                                              "(repeatable).")]

# What a search space is derived from (`tuner study create`, `tuner space suggest`).
ModelOption = Annotated[Optional[Path], typer.Option(help="Model folder; default: the tiny model.")]
TraceOption = Annotated[Optional[Path], typer.Option(help="Trace file; default: the bundled Azure cut.")]

# --- which part of a trace is replayed --------------------------------------------------------------------

FormatOption = Annotated[Optional[str], typer.Option("--format", help="azure, mooncake, burstgpt or native; "
                                                                     "detected when left out.")]
WindowOption = Annotated[Optional[str], typer.Option(help="START:END seconds of the trace to keep.")]
RateOption = Annotated[Optional[float], typer.Option(help="Multiply the arrival rate (2 = twice as fast).")]
CapOption = Annotated[Optional[int], typer.Option(help="Keep the first N requests (after the window).")]
FitOption = Annotated[Optional[str], typer.Option(help="clip or scale lengths to fit max_model_len.")]
SpreadOption = Annotated[bool, typer.Option("--spread", help="Spread the requests that share one recorded arrival "
                                                             "evenly up to the next arrival (Mooncake records "
                                                             "arrivals in buckets of about 3 s).")]


# --- how much load a trial probes ---------------------------------------------------------------------------

LoadOption = Annotated[str, typer.Option(
    "--load", help="search: probe several loads on one launch and find the highest that passes the boundary (the "
                   "capacity); fixed: one replay at the reference load (the trace at --rate-scale).")]
PrecisionOption = Annotated[float, typer.Option(help="The load search ends once its bracket is within this share "
                                                     "(0.1 = 10%).")]
ProbeBudgetOption = Annotated[int, typer.Option(help="Probes per trial at most, the reference load's included.")]
LoadRangeOption = Annotated[Optional[str], typer.Option(help="MIN:MAX loads the search may probe, as multiples of the "
                                                             "reference load; default 0.0039:64 (a 256th to 64 "
                                                             "times: below the reference, as far as the machine "
                                                             "needs).")]
ProbeRequestsOption = Annotated[int, typer.Option(help="Each probe replays the trace, repeated, until it holds this "
                                                       "many requests (a p95 needs about 75 to be told from its "
                                                       "limit).")]
ProbeSecondsOption = Annotated[float, typer.Option(help="...and until its arrivals last this many seconds (a burst "
                                                        "shorter than a request's latency cannot show whether the "
                                                        "engine keeps up).")]


def load_policy(load: str, precision: float, probe_budget: int, load_range: str | None,
                probe_requests: int, probe_seconds: float) -> LoadPolicy:
    """The load policy the load options ask for (TunerError for a value out of range)."""
    return LoadPolicy.from_options(load, precision, probe_budget, load_range, probe_requests, probe_seconds)


def trace_selection(window: str | None, max_requests: int | None, rate_scale: float | None,
                    fit: str | None, spread: bool = False) -> TraceSelection:
    """The selection the trace-selection options ask for (TunerError for a malformed one)."""
    return TraceSelection.from_options(window, max_requests, rate_scale, fit, spread)


def storage_plan(storage: str | None, artifacts: Path | None, **kwargs):
    """The storage plan that --storage and --artifacts name (their defaults when left out); `kwargs` go to
    StoragePlan.resolve."""
    return StoragePlan.resolve(storage, artifacts, **kwargs)


def study_answers(server: str | None, token_file: Path | None, storage: str | None,
                  artifacts: Path | None) -> Studies:
    """The study answers: asked of the service at `server`, or read from the storage here."""
    if server:
        # lazy: keeps the CLI's start fast (the answers' pydantic models)
        from tuner.service.client import remote_studies

        return remote_studies(server, token_file)
    from tuner.studies import LocalStudies

    return LocalStudies(storage_plan(storage, artifacts))
TopOption = Annotated[int, typer.Option(min=1, help="Validate this many of the best feasible configurations.")]
RepeatsOption = Annotated[int, typer.Option(min=2, help="Launches of each validated configuration and of vLLM's "
                                                        "default (at least 2, for an interval).")]
PairingOption = Annotated[bool, typer.Option(help="Where the slot has a GPU and vLLM has sleep mode, validate one "
                                                  "engine per configuration, the two taking turns, each load probed "
                                                  "on both back to back; --no-pairing launches them interleaved.")]
