"""A validation's design, decided before any launch: its arms, their launches round by round, and whether they run
paired on one GPU or as interleaved launches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.storage import ValidationMark


# Documented defaults, sized so that a study on one GPU stays short: the best configuration, twice, against the
# default, twice.
DEFAULT_TOP = 1
DEFAULT_REPEATS = 2


@dataclass(frozen=True)
class Arm:
    """One configuration in a validation: vLLM's default (`of_trial` None) or a search trial's."""

    index: int
    of_trial: int | None

    @property
    def label(self) -> str:
        """How people read it: `vLLM's default`, `vLLM's default (again)` in an A/A check, `trial 3`."""
        if self.of_trial is None:
            return "vLLM's default" + (" (again)" if self.index > 0 else "")
        return f"trial {self.of_trial}"


PAIRED = "paired on one engine pair with sleep mode"


@dataclass(frozen=True)
class Pairing:
    """How a validation's launches are run, decided before any is: paired (one engine per arm on one GPU, the arms
    taking turns through vLLM's sleep mode, so each load is probed on both within seconds) or interleaved launches,
    and why."""

    paired: bool
    reason: str  # why interleaved; empty when paired

    @property
    def text(self) -> str:
        """`paired on one engine pair with sleep mode`, or `interleaved launches: vLLM's CPU build has no sleep
        mode`."""
        return PAIRED if self.paired else f"interleaved launches: {self.reason}"


def pairing(arms: int, slot_gpus: int, sleep_mode: bool, wanted: bool = True) -> Pairing:
    """Whether a validation of `arms` arms runs paired: on a slot with a GPU (`slot_gpus`, 0 for a CPU slot: vLLM has
    sleep mode on CUDA, ROCm and XPU only, `Platform.is_sleep_mode_available`), where the installed vLLM serves the
    sleep endpoints (`sleep_mode`), for two arms (a sleeping engine keeps its CUDA graphs and context on the GPU:
    one more beside them is more than the default's 92% of the memory leaves room for), unless turned off."""
    if not wanted:
        return Pairing(False, "pairing turned off (--no-pairing)")
    if not slot_gpus:
        return Pairing(False, "vLLM's CPU build has no sleep mode")
    if not sleep_mode:
        return Pairing(False, "the installed vLLM serves no sleep mode endpoints")
    if arms != 2:
        return Pairing(False, f"paired validation takes two configurations, this one {arms}")
    return Pairing(True, "")


def paired_design(paired_rounds: int, rounds: int, fallback: str | None) -> str:
    """How a validation begun paired ran: `PAIRED`; or, where it could not go on (`fallback`: why), paired for the
    rounds it ran in full, then interleaved launches."""
    if fallback is None:
        return PAIRED
    if not paired_rounds:
        return f"interleaved launches: {fallback}"
    return f"{PAIRED} for {paired_rounds} of {rounds} rounds, then interleaved launches: {fallback}"


def interleaved(arms: Sequence[Arm], repeats: int, run: int) -> list[ValidationMark]:
    """Every arm `repeats` times, round by round (A B C A B C ...): drift of the machine over the validation then
    hits every arm alike."""
    if repeats < 2:
        raise ValueError("a validation needs at least 2 repeats of each configuration to give an interval")
    return [ValidationMark(run, r, repeats, arm.index, arm.of_trial) for r in range(1, repeats + 1) for arm in arms]
