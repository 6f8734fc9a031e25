"""The probes a trial has finished, written as each ends, so that a re-run of a trial cut off (its machine taken
back, its driver killed, a run stopped) goes on after them instead of starting over.

Every probe begins on an idle engine with prompts of its own seed (`probes.run_probes`), so a probe finished on an
earlier launch of the same configuration, on a machine of the same kind, is the probe the re-run would measure.
A probe during which the engine was lost is never kept: the re-run measures it again."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tuner.workers.engine_config import EngineConfig
from tuner.workers.probes import Probe, ProbeRun
from tuner.workers.request_record import RequestRecord
from tuner.workers.server_metrics import TimelineSample

PROBE_LOG = "probes.jsonl"  # beside the trial's server log: a header line, then one line per finished probe


@dataclass(frozen=True)
class ResumedProbes:
    """The probes an earlier launch of a configuration finished before it was cut off: the machine they were
    measured on (`HardwareInfo.describe()`), and the probes in order, each naming the trial that measured it."""

    hardware: str
    runs: tuple[ProbeRun, ...]


@dataclass(frozen=True)
class ProbeLog:
    """One launch's log of finished probes."""

    path: Path

    def begin(self, config: EngineConfig, hardware: str, resumed: Sequence[ProbeRun]) -> None:
        """Start the log with the configuration and machine it measures, and the probes this launch resumes after
        (written again here, so that a cut of this launch too hands them on)."""
        header = {"engine_config": config.to_dict(), "hardware": hardware, "resumed": len(resumed)}
        self.path.write_text(json.dumps(header) + "\n")
        for run in resumed:
            self.append(run)

    def append(self, run: ProbeRun) -> None:
        """Keep a finished probe."""
        line = {"probe": run.probe.to_dict(), "records": [r.to_dict() for r in run.records],
                "timeline": [asdict(s) for s in run.timeline]}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def read(self, trial: int, config: EngineConfig) -> ResumedProbes | None:
        """The probes kept by trial `trial`'s launch, when the log was written for `config` and kept any; None
        otherwise (no log, another configuration, or nothing readable)."""
        header, lines = self._lines()
        if header is None or EngineConfig.from_dict(header["engine_config"]) != config or not lines:
            return None
        runs = []
        for line in lines:
            probe = Probe.from_dict(line["probe"])
            if probe.earlier_trial is None:  # its own, not one it resumed after
                probe = replace(probe, earlier_trial=trial)
            runs.append(ProbeRun(probe, [RequestRecord.from_dict(r) for r in line["records"]],
                                 [TimelineSample(**s) for s in line["timeline"]]))
        return ResumedProbes(header["hardware"], tuple(runs))

    def runs_again(self, rerun: bool) -> bool:
        """Whether the launch that wrote the log, cut off, is queued to run once more: a first launch always, a
        re-run only if it finished a probe of its own (so each re-run gets further, and one that gets nowhere is
        not re-run forever)."""
        header, lines = self._lines()
        return not rerun or (header is not None and len(lines) > header["resumed"])

    def _lines(self) -> tuple[dict | None, list[dict]]:
        """The header and the probe lines; a last line cut short by the machine's loss is left out."""
        try:
            text = self.path.read_text()
        except OSError:
            return None, []
        parsed = []
        for line in text.splitlines():
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return (parsed[0], parsed[1:]) if parsed else (None, [])
