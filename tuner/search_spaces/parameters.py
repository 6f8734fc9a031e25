"""The file's searched settings: an int or float range, or a list of choices; each checked against the setting it
names, and each a distribution and a suggestion for Optuna."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import AllowInfNan, Field, Strict, StrictBool, StrictInt, model_validator

from tuner.search_spaces.messages import refused
from tuner.search_spaces.settings import SETTING_KINDS, Record, Scalar, Value, engine_value

_Number = Annotated[float, Strict(), AllowInfNan(False)]  # an int is accepted too
_N = TypeVar("_N", bound=float)  # int or float


class _Parameter(Record):
    @model_validator(mode="before")
    @classmethod
    def _absent_is_empty(cls, data: Any) -> Any:
        """An absent `low`, `high` or `choices` reads as one written empty: `expected an integer, got nothing`."""
        if not isinstance(data, dict):
            return data
        return {**{name: None for name, field in cls.model_fields.items() if field.is_required()}, **data}


class _Range(_Parameter, Generic[_N]):
    """A range of numbers of type _N: [low, high], continuous (floats), on a grid of `step`, or on a log scale."""

    type: str  # narrowed to the tag of each kind of range
    low: _N
    high: _N
    step: Annotated[_N, Field(gt=0)] | None = None
    log: StrictBool = False

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.low > self.high:
            raise refused(f"low ({self.low}) is above high ({self.high})")
        if self.log and self.low <= 0:
            raise refused(f"a log scale needs low above 0, got {self.low}", "low")
        if self.step is not None:
            if self.log:
                raise refused("step and log cannot be combined", "step")
            if not self._whole_steps(self.step):
                raise refused(f"high ({self.high}) is not low ({self.low}) plus a whole number of steps "
                               f"({self.step})", "high")
        return self

    def _whole_steps(self, step: _N) -> bool:
        """Whether [low, high] is a whole number of steps; each kind of range does the arithmetic its own way."""
        raise NotImplementedError

    def for_setting(self, name: str) -> Self:
        """This range as setting `name` takes it: of the setting's own type, with bounds EngineConfig accepts.
        Errors name keys relative to `parameters`."""
        kind = SETTING_KINDS[name]
        if kind != self.type:
            raise refused(f"{name} is a {kind} setting; use type {kind} or categorical", f"{name}.type")
        for bound in ("low", "high"):
            engine_value(name, getattr(self, bound), f"{name}.{bound}")
        return self


class IntParameter(_Range[StrictInt]):
    """An integer, uniform over [low, high] on a grid of `step` (unset: 1), or on a log scale."""

    type: Literal["int"]

    def _whole_steps(self, step: int) -> bool:
        return (self.high - self.low) % step == 0  # exact, for integers of any size

    def distribution(self) -> IntDistribution:
        """This range as an Optuna distribution."""
        return IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)

    def suggest(self, trial: optuna.trial.Trial, name: str) -> int:
        """The value `trial` proposes for setting `name`, within this range."""
        return trial.suggest_int(name, self.low, self.high, step=self.step or 1, log=self.log)


class FloatParameter(_Range[_Number]):
    """A float over [low, high], continuous, on a grid of `step`, or on a log scale."""

    type: Literal["float"]

    def _whole_steps(self, step: float) -> bool:
        steps = (self.high - self.low) / step
        if not math.isfinite(steps):
            raise refused(f"{step} is too small for the range {self.low} to {self.high}", "step")
        return math.isclose(steps, round(steps), abs_tol=1e-9)

    def distribution(self) -> FloatDistribution:
        """This range as an Optuna distribution."""
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def suggest(self, trial: optuna.trial.Trial, name: str) -> float:
        """The value `trial` proposes for setting `name`, within this range; on a grid, rounded to the step's
        decimals."""
        value = trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)
        if self.step is None:
            return value
        # Optuna's grid is low + k * step in binary floating point (0.7500000000000001): round it to the
        # step's own decimals, so that the vllm serve command reads as the grid was written.
        decimals = max(0, -Decimal(str(self.step)).normalize().as_tuple().exponent)
        return round(value, decimals)


class CategoricalParameter(_Parameter):
    """One of a list of values; null is vLLM's own default (the flag left out: `quantization: [null, fp8]`)."""

    type: Literal["categorical"]
    choices: Annotated[tuple[Value | None, ...], Field(min_length=1)]

    def for_setting(self, name: str) -> Self:
        """The choices as setting `name` takes them (`'8'` is 8 for an int setting), each one EngineConfig
        accepts and none twice. Errors name keys relative to `parameters`."""
        choices = tuple(engine_value(name, c, f"{name}.choices[{i}]") for i, c in enumerate(self.choices))
        repeated = [c for i, c in enumerate(choices) if c in choices[:i]]
        if repeated:
            raise refused(f"{repeated[0]!r} is listed twice", f"{name}.choices")
        return self.model_copy(update={"choices": choices})

    def distribution(self) -> CategoricalDistribution:
        """These choices as an Optuna distribution."""
        return CategoricalDistribution(self.choices)

    def suggest(self, trial: optuna.trial.Trial, name: str) -> Scalar | None:
        """The choice `trial` proposes for setting `name`."""
        return trial.suggest_categorical(name, self.choices)


Parameter = Annotated[IntParameter | FloatParameter | CategoricalParameter, Field(discriminator="type")]
