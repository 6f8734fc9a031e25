"""A loaded search space: the settings it fixes and searches, what Optuna proposes from it, its baseline, and why a
proposal cannot run (the built-in rules, then the file's constraints)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution

from tuner.search_spaces.constraints import Constraint
from tuner.search_spaces.context import SpaceContext
from tuner.search_spaces.parameters import CategoricalParameter, Parameter
from tuner.search_spaces.rules import BUILT_IN_RULES
from tuner.search_spaces.settings import Scalar
from tuner.workers.engine_config import EngineConfig


@dataclass(frozen=True)
class SearchSpace:
    """A loaded, validated search space file."""

    name: str
    description: str
    path: Path
    text: str  # the file as written, stored with a study
    fixed: dict[str, Scalar]
    parameters: dict[str, Parameter]
    constraints: tuple[Constraint, ...]

    def suggest(self, trial: optuna.trial.Trial, only: Collection[str] | None = None) -> EngineConfig:
        """Ask the trial for every parameter, or for those named in `only` (the rest left at vLLM's default); the
        configuration it proposes, fixed values included."""
        return EngineConfig(**self.fixed, **{name: p.suggest(trial, name) for name, p in self.parameters.items()
                                             if only is None or name in only})

    def baseline(self) -> EngineConfig:
        """The fixed values only: every searched setting at vLLM's own default."""
        return EngineConfig(**self.fixed)

    def distributions(self) -> dict[str, BaseDistribution]:
        """Each searched setting's Optuna distribution, by name."""
        return {name: p.distribution() for name, p in self.parameters.items()}

    def numerics_settings(self) -> list[str]:
        """The settings through which this space can propose other numerics than the checkpoint's (FP8 weights or
        KV cache): fixed so, or with such a choice."""
        return [name for name, value in self.fixed.items() if _changes_numerics(name, value)] + list(self.precision())

    def precision(self) -> dict[str, Scalar]:
        """Each searched setting that can change the numerics (FP8 weights, FP8 KV cache) at its first choice that
        does: with vLLM's default otherwise, what precision alone buys. Empty where the space searches none."""
        found = {}
        for name, p in self.parameters.items():
            if isinstance(p, CategoricalParameter):
                changing = [c for c in p.choices if _changes_numerics(name, c)]
                if changing:
                    found[name] = changing[0]
        return found

    def violations(self, config: EngineConfig, context: SpaceContext) -> list[str]:
        """Why `config` cannot run in `context` (empty: feasible): the built-in rules, then the file's constraints."""
        values = config.to_dict()
        found = [rule(config, context) for rule in BUILT_IN_RULES]
        found += [c.violation(values) for c in self.constraints]
        return [reason for reason in found if reason is not None]


def _changes_numerics(name: str, value: object) -> bool:
    return EngineConfig.from_dict({name: value}).changes_numerics
