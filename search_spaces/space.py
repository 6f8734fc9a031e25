"""Search spaces: YAML files declaring which vLLM settings a study searches, and which proposals are infeasible.

A file names settings that are `fixed` (always set), `parameters` (searched: int, float or categorical) and
`constraints` between settings (`NAME OP VALUE`, optionally `when: NAME OP VALUE`). Every proposal is also
checked against the built-in rules below, before any launch, so an impossible configuration costs no trial.

The format is pydantic records (SpaceFile, and the parameters and constraints that the rest of tuner uses as
read); their JSON Schema is published as search_spaces/schema.json. A broken file is refused with one line that
names the file and the key.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from decimal import Decimal
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, Self, TypeVar, Union, get_args, get_origin

import optuna
import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import (AllowInfNan, BaseModel, ConfigDict, Field, GetCoreSchemaHandler, Strict, StrictBool, StrictFloat,
                      StrictInt, StrictStr, ValidationError, ValidatorFunctionWrapHandler, WrapValidator,
                      field_validator, model_validator)
from pydantic_core import ErrorDetails, PydanticCustomError, core_schema

from tuner.errors import TunerError
from tuner.kv_budget import DeviceMemory, Fit, ModelMemory, estimate_kv
from tuner.traces.transforms import FIT_MODES
from tuner.workers.engine_config import EngineConfig

if TYPE_CHECKING:
    from tuner.models import ModelInfo
    from tuner.traces.records import Trace

Scalar = bool | int | float | str
# How a proposal refused for its estimated KV cache is named, in its reasons and as its failure class.
PREDICTED_KV_INSUFFICIENT = "kv_insufficient (predicted)"

# "int", "float", "bool" or "str" for every EngineConfig field (its annotations are strings like "int | None").
_FIELD_KINDS = {f.name: str(f.type).split(" |")[0] for f in fields(EngineConfig)}


@dataclass(frozen=True)
class PlatformSupport:
    """What vLLM's build for one platform can run."""

    dtypes: tuple[str, ...]
    fp8_kv_cache: bool


# The one table of platform support: vLLM's CPU backend has no float16 path and no fp8 KV cache on these machines.
PLATFORMS = {
    "cuda": PlatformSupport(dtypes=("auto", "half", "float16", "bfloat16", "float", "float32"), fp8_kv_cache=True),
    "cpu": PlatformSupport(dtypes=("auto", "bfloat16", "float", "float32"), fp8_kv_cache=False),
}


@dataclass(frozen=True)
class SpaceContext:
    """What a proposal is judged against: the platform, the trace to replay, and the model."""

    platform: str  # "cpu" or "cuda"
    longest_request_tokens: int  # max input + output over the trace that will be replayed
    fit: str | None  # "clip" or "scale": the trace is fitted to max_model_len, so a short context is allowed
    model_max_len: int  # the model's max_position_embeddings
    # The model's sizes and the device's memory: with both, a proposal whose estimated KV cache cannot hold one
    # request of its max_model_len is refused before launch.
    model_memory: ModelMemory | None = None
    device: DeviceMemory | None = None

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise TunerError(f"platform must be one of {', '.join(PLATFORMS)}, got {self.platform!r}")
        if self.fit is not None and self.fit not in FIT_MODES:
            raise TunerError(f"fit must be one of {', '.join(FIT_MODES)} or unset, got {self.fit!r}")
        if self.longest_request_tokens < 0:
            raise TunerError(f"longest_request_tokens must be at least 0, got {self.longest_request_tokens}")
        if self.model_max_len < 1:
            raise TunerError(f"model_max_len must be at least 1, got {self.model_max_len}")

    @classmethod
    def for_run(cls, platform: str, model: ModelInfo, trace: Trace, fit: str | None,
                model_memory: ModelMemory | None = None, device: DeviceMemory | None = None) -> SpaceContext:
        """The context of replaying `trace` (as read, before any fitting) against `model` on `platform`."""
        longest = max((r.input_tokens + r.output_tokens for r in trace.requests), default=0)
        return cls(platform, longest, fit, model.max_position_embeddings, model_memory, device)


# ---- built-in rules: each returns why a configuration is infeasible, or None ----

def _context_len(config: EngineConfig, context: SpaceContext) -> int:
    """max_model_len as vLLM runs it: unset means the model's own."""
    return config.max_model_len if config.max_model_len is not None else context.model_max_len


def _context_label(config: EngineConfig, context: SpaceContext) -> str:
    if config.max_model_len is not None:
        return f"max_model_len ({config.max_model_len})"
    return f"max_model_len (unset: the model's {context.model_max_len})"


def batched_tokens_cover_seqs(config: EngineConfig, context: SpaceContext) -> str | None:
    """max_num_batched_tokens >= max_num_seqs: vLLM refuses to start otherwise. Checked when both are set."""
    if config.max_num_batched_tokens is None or config.max_num_seqs is None:
        return None
    if config.max_num_batched_tokens >= config.max_num_seqs:
        return None
    return (f"max_num_batched_tokens ({config.max_num_batched_tokens}) is below max_num_seqs "
            f"({config.max_num_seqs}); vLLM requires at least one token per sequence in a batch")


def context_holds_longest_request(config: EngineConfig, context: SpaceContext) -> str | None:
    """max_model_len >= the trace's longest request, unless the trace is fitted (clip or scale) to it."""
    if context.fit is not None or _context_len(config, context) >= context.longest_request_tokens:
        return None
    return (f"{_context_label(config, context)} is below the trace's longest request "
            f"({context.longest_request_tokens} tokens); fit the trace (clip or scale) to allow a shorter context")


def context_within_model(config: EngineConfig, context: SpaceContext) -> str | None:
    """max_model_len <= the model's max_position_embeddings: vLLM refuses a longer context."""
    if config.max_model_len is None or config.max_model_len <= context.model_max_len:
        return None
    return (f"max_model_len ({config.max_model_len}) is above the model's max_position_embeddings "
            f"({context.model_max_len})")


def dtype_on_platform(config: EngineConfig, context: SpaceContext) -> str | None:
    """dtype must be one the platform supports (see PLATFORMS)."""
    supported = PLATFORMS[context.platform].dtypes
    if config.dtype is None or config.dtype in supported:
        return None
    return f"dtype {config.dtype} is not available on {context.platform} (supported: {', '.join(supported)})"


def kv_cache_dtype_on_platform(config: EngineConfig, context: SpaceContext) -> str | None:
    """An fp8 kv_cache_dtype needs a platform with an fp8 KV cache (see PLATFORMS): not cpu."""
    kv_dtype = config.kv_cache_dtype
    if kv_dtype is None or not kv_dtype.startswith("fp8") or PLATFORMS[context.platform].fp8_kv_cache:
        return None
    return f"kv_cache_dtype {kv_dtype} is not available on {context.platform}"


def kv_cache_holds_one_request(config: EngineConfig, context: SpaceContext) -> str | None:
    """The estimated KV cache holds one request of max_model_len: vLLM refuses to start otherwise. Refused only
    when even the estimate's error could not make it fit; a proposal near the margin is launched."""
    if context.model_memory is None or context.device is None:
        return None
    estimate = estimate_kv(context.model_memory, context.device, config)
    if estimate.fit(_context_len(config, context)) is not Fit.SHORT:
        return None
    if estimate.bytes <= 0:
        weights = context.model_memory.weight_bytes(config.dtype) / 2**30
        return (f"{PREDICTED_KV_INSUFFICIENT}: the weights ({weights:.1f} GiB) and the engine's overheads leave no "
                f"KV cache at gpu_memory_utilization {config.gpu_memory_utilization or 'default'}")
    return (f"{PREDICTED_KV_INSUFFICIENT}: the KV cache is estimated at {estimate.describe()}, "
            f"below one request of {_context_label(config, context)}")


def unchunked_batch_holds_context(config: EngineConfig, context: SpaceContext) -> str | None:
    """With enable_chunked_prefill false, max_num_batched_tokens >= max_model_len: vLLM refuses otherwise.

    Checked when max_num_batched_tokens is set (vLLM's own default is large enough).
    """
    if config.enable_chunked_prefill is not False or config.max_num_batched_tokens is None:
        return None
    if config.max_num_batched_tokens >= _context_len(config, context):
        return None
    return (f"max_num_batched_tokens ({config.max_num_batched_tokens}) is below "
            f"{_context_label(config, context)} with enable_chunked_prefill false; a whole prompt must fit one batch")


Rule = Callable[[EngineConfig, SpaceContext], str | None]
BUILT_IN_RULES: tuple[Rule, ...] = (
    batched_tokens_cover_seqs, context_holds_longest_request, context_within_model,
    dtype_on_platform, kv_cache_dtype_on_platform, unchunked_batch_holds_context, kv_cache_holds_one_request,
)


# ---- constraint expressions: NAME OP VALUE, tokenized by hand, never evaluated as code ----

_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
            "==": operator.eq, "!=": operator.ne}
_TOKEN = re.compile(r"""\s*(?:
    (?P<op><=|>=|==|!=|<|>)
  | (?P<string>'[^']*'|"[^"]*")
  | (?P<number>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
)""", re.VERBOSE)


@dataclass(frozen=True)
class Operand:
    """One side of a comparison: an EngineConfig field, or a literal."""

    field: str | None = None
    literal: Scalar | None = None

    @property
    def kind(self) -> str:
        """One of number, bool or str: only like is compared with like."""
        if self.field is not None:
            kind = _FIELD_KINDS[self.field]
            return "number" if kind in ("int", "float") else kind
        if isinstance(self.literal, bool):
            return "bool"
        return "str" if isinstance(self.literal, str) else "number"

    def value(self, values: dict[str, Any]) -> Any:
        return values.get(self.field) if self.field is not None else self.literal


@dataclass(frozen=True)
class Comparison:
    """`left OP right`; `evaluate` is None when a field it names is unset."""

    left: Operand
    op: str
    right: Operand
    text: str

    def evaluate(self, values: dict[str, Any]) -> bool | None:
        left, right = self.left.value(values), self.right.value(values)
        if left is None or right is None:
            return None
        return _COMPARE[self.op](left, right)

    def shown(self, values: dict[str, Any]) -> str:
        """The fields' values in this configuration, e.g. `max_num_seqs=8, max_model_len=1024`."""
        names = dict.fromkeys(o.field for o in (self.left, self.right) if o.field is not None)
        return ", ".join(f"{name}={values.get(name)}" for name in names)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """In a pydantic record, a comparison is written as its text (`NAME OP VALUE`) and parsed on validation."""
        return core_schema.no_info_after_validator_function(_parsed_comparison, core_schema.str_schema(strict=True))


def parse_comparison(text: str) -> Comparison:
    """Parse `NAME OP VALUE` (either side a field or a number, true/false or quoted-string literal)."""
    tokens: list[tuple[str, str]] = []
    position, stripped = 0, text.rstrip()
    while position < len(stripped):
        match = _TOKEN.match(stripped, position)
        if match is None or match.lastgroup is None:
            raise TunerError(f"unexpected {stripped[position:].lstrip()[:1]!r} in {text!r}; "
                             "expected NAME OP VALUE with OP one of < <= > >= == !=")
        tokens.append((match.lastgroup, match.group(match.lastgroup)))
        position = match.end()
    kinds = [kind for kind, _ in tokens]
    if len(tokens) != 3 or kinds[1] != "op" or "op" in (kinds[0], kinds[2]):
        raise TunerError(f"expected NAME OP VALUE with OP one of < <= > >= == !=, got {text!r}")
    left, right = _operand(*tokens[0]), _operand(*tokens[2])
    op = tokens[1][1]
    if left.field is None and right.field is None:
        raise TunerError(f"{text!r} compares two literals; one side must be an engine setting")
    if left.kind != right.kind:
        raise TunerError(f"{text!r} compares a {left.kind} with a {right.kind}")
    if op not in ("==", "!=") and left.kind != "number":
        raise TunerError(f"{text!r}: {op} compares numbers only, not a {left.kind}")
    for side, other in ((left, right), (right, left)):
        if side.field is not None and other.field is None and side.kind == "str":
            # A misspelt choice (dtype == 'bf16') would make the comparison silently never hold.
            EngineConfig(**{side.field: other.literal})
    return Comparison(left, op, right, " ".join(value for _, value in tokens))


def _parsed_comparison(text: str) -> Comparison:
    try:
        return parse_comparison(text)
    except TunerError as exc:
        raise _refused(str(exc)) from None


def _operand(kind: str, token: str) -> Operand:
    if kind == "string":
        return Operand(literal=token[1:-1])
    if kind == "number":
        return Operand(literal=float(token) if any(c in token for c in ".eE") else int(token))
    if token.lower() in ("true", "false"):
        return Operand(literal=token.lower() == "true")
    if token not in _FIELD_KINDS:
        raise TunerError(f"unknown engine setting {token!r} (quote a string literal: '{token}'); "
                         f"known: {', '.join(_FIELD_KINDS)}")
    return Operand(field=token)


# ---- the file format: pydantic models, also the records the rest of tuner uses ----

def _refused(message: str, key: str | None = None) -> PydanticCustomError:
    """A check of the format that is more than a type: `message` about `key` (None: the record itself).

    The key is relative to the record being validated, so that an error found by a record's own validator
    still names the exact key in the file."""
    return PydanticCustomError("space_format", "{message}", {"key": key, "message": message})


def _refused_as(message: Callable[[Any], str]) -> WrapValidator:
    """A type refused with one error of ours, `message(value)`, instead of pydantic's (one per member of a union,
    or a literal's every value)."""
    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise _refused(message(value)) from None
    return WrapValidator(validate)


# A value as YAML writes it; EngineConfig then reads it as its setting's type (`fixed` and `choices`).
_Value = Annotated[StrictBool | StrictInt | StrictFloat | StrictStr,
                   _refused_as(lambda value: f"expected a single value, got {_shown(value)}")]
# The name of an EngineConfig field (taken from EngineConfig, so that a new field is a new setting at once).
if TYPE_CHECKING:
    _Setting = str
else:
    _Setting = Annotated[Literal[tuple(_FIELD_KINDS)],
                         _refused_as(lambda _: f"unknown engine setting; known: {', '.join(_FIELD_KINDS)}")]
_Number = Annotated[float, Strict(), AllowInfNan(False)]  # an int is accepted too
_N = TypeVar("_N", bound=float)  # int or float


def _engine_value(name: str, value: Scalar, key: str) -> Scalar:
    """`value` as EngineConfig stores setting `name`; EngineConfig's own message, at `key`, if it refuses it."""
    try:
        return getattr(EngineConfig.from_dict({name: value}), name)
    except TunerError as exc:
        raise _refused(str(exc), key) from None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Parameter(_Record):
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
            raise _refused(f"low ({self.low}) is above high ({self.high})")
        if self.log and self.low <= 0:
            raise _refused(f"a log scale needs low above 0, got {self.low}", "low")
        if self.step is not None:
            if self.log:
                raise _refused("step and log cannot be combined", "step")
            if not self._whole_steps(self.step):
                raise _refused(f"high ({self.high}) is not low ({self.low}) plus a whole number of steps "
                               f"({self.step})", "high")
        return self

    def _whole_steps(self, step: _N) -> bool:
        """Whether [low, high] is a whole number of steps; each kind of range does the arithmetic its own way."""
        raise NotImplementedError

    def for_setting(self, name: str) -> Self:
        """This range as setting `name` takes it: of the setting's own type, with bounds EngineConfig accepts.
        Errors name keys relative to `parameters`."""
        kind = _FIELD_KINDS[name]
        if kind != self.type:
            raise _refused(f"{name} is a {kind} setting; use type {kind} or categorical", f"{name}.type")
        for bound in ("low", "high"):
            _engine_value(name, getattr(self, bound), f"{name}.{bound}")
        return self


class IntParameter(_Range[StrictInt]):
    """An integer, uniform over [low, high] on a grid of `step` (unset: 1), or on a log scale."""

    type: Literal["int"]

    def _whole_steps(self, step: int) -> bool:
        return (self.high - self.low) % step == 0  # exact, for integers of any size

    def distribution(self) -> IntDistribution:
        return IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)

    def suggest(self, trial: optuna.trial.Trial, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, step=self.step or 1, log=self.log)


class FloatParameter(_Range[_Number]):
    """A float over [low, high], continuous, on a grid of `step`, or on a log scale."""

    type: Literal["float"]

    def _whole_steps(self, step: float) -> bool:
        steps = (self.high - self.low) / step
        if not math.isfinite(steps):
            raise _refused(f"{step} is too small for the range {self.low} to {self.high}", "step")
        return math.isclose(steps, round(steps), abs_tol=1e-9)

    def distribution(self) -> FloatDistribution:
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def suggest(self, trial: optuna.trial.Trial, name: str) -> float:
        value = trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)
        if self.step is None:
            return value
        # Optuna's grid is low + k * step in binary floating point (0.7500000000000001): round it to the
        # step's own decimals, so that the vllm serve command reads as the grid was written.
        decimals = max(0, -Decimal(str(self.step)).normalize().as_tuple().exponent)
        return round(value, decimals)


class CategoricalParameter(_Parameter):
    """One of a list of values."""

    type: Literal["categorical"]
    choices: Annotated[tuple[_Value, ...], Field(min_length=1)]

    def for_setting(self, name: str) -> Self:
        """The choices as setting `name` takes them (`'8'` is 8 for an int setting), each one EngineConfig
        accepts and none twice. Errors name keys relative to `parameters`."""
        choices = tuple(_engine_value(name, c, f"{name}.choices[{i}]") for i, c in enumerate(self.choices))
        repeated = [c for i, c in enumerate(choices) if c in choices[:i]]
        if repeated:
            raise _refused(f"{repeated[0]!r} is listed twice", f"{name}.choices")
        return self.model_copy(update={"choices": choices})

    def distribution(self) -> CategoricalDistribution:
        return CategoricalDistribution(self.choices)

    def suggest(self, trial: optuna.trial.Trial, name: str) -> Scalar:
        return trial.suggest_categorical(name, self.choices)


Parameter = Annotated[IntParameter | FloatParameter | CategoricalParameter, Field(discriminator="type")]


def _tag(record: type[BaseModel]) -> str | None:
    """The `type` a parameter record is written with (None: not a parameter)."""
    field = record.model_fields.get("type")
    return get_args(field.annotation)[0] if field is not None else None


class Constraint(_Record):
    """`require` must hold whenever `when` does; a field unset in a configuration makes it not apply."""

    require: Comparison = Field(description="NAME OP VALUE, e.g. max_num_batched_tokens >= max_model_len")
    when: Comparison | None = Field(None, description="NAME OP VALUE: require applies only where this holds")

    def violation(self, values: dict[str, Any]) -> str | None:
        if self.when is not None and not self.when.evaluate(values):
            return None
        if self.require.evaluate(values) is not False:
            return None
        condition = f" (when {self.when.text})" if self.when is not None else ""
        return f"constraint {self.require.text}{condition} fails: {self.require.shown(values)}"


# Its JSON Schema is published as search_spaces/schema.json (tests/test_search_spaces.py keeps the two equal).
class SpaceFile(_Record):
    """A search space file for tuner: the vLLM settings a study fixes, those it searches, and the constraints
    between them; a setting is either fixed or searched."""

    model_config = ConfigDict(title="tuner search space", json_schema_extra={
        "$schema": "https://json-schema.org/draft/2020-12/schema"})

    name: StrictStr | None = Field(None, description="the space's name; unset: the file's name without .yaml")
    description: StrictStr = ""
    fixed: dict[_Setting, _Value] = Field(default_factory=dict, description="settings every trial runs with")
    parameters: dict[_Setting, Parameter] = Field(default_factory=dict, description="settings searched")
    constraints: list[Constraint] = Field(default_factory=list,
                                          description="rules between settings; a proposal that breaks one is "
                                                      "refused before launch")

    @model_validator(mode="before")
    @classmethod
    def _empty_section_is_absent(cls, data: Any) -> Any:
        """`fixed:` with nothing under it (YAML's null) is no fixed values, and so for the other sections."""
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items() if not (value is None and key in _SECTIONS)}

    @field_validator("fixed")
    @classmethod
    def _fixed_as_engine_takes_them(cls, fixed: dict[str, Scalar]) -> dict[str, Scalar]:
        return {name: _engine_value(name, value, name) for name, value in fixed.items()}

    @field_validator("parameters")
    @classmethod
    def _parameters_as_engine_takes_them(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        return {name: parameter.for_setting(name) for name, parameter in parameters.items()}

    @model_validator(mode="after")
    def _fixed_or_searched(self) -> Self:
        both = [name for name in self.parameters if name in self.fixed]
        if both:
            raise _refused("is also fixed; a setting is either fixed or searched", f"parameters.{both[0]}")
        return self


_SECTIONS = ("fixed", "parameters", "constraints")


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

    def suggest(self, trial: optuna.trial.Trial) -> EngineConfig:
        """Ask the trial for every parameter; the configuration it proposes, fixed values included."""
        return EngineConfig(**self.fixed, **{name: p.suggest(trial, name) for name, p in self.parameters.items()})

    def baseline(self) -> EngineConfig:
        """The fixed values only: every searched setting at vLLM's own default."""
        return EngineConfig(**self.fixed)

    def distributions(self) -> dict[str, BaseDistribution]:
        return {name: p.distribution() for name, p in self.parameters.items()}

    def violations(self, config: EngineConfig, context: SpaceContext) -> list[str]:
        """Why `config` cannot run in `context` (empty: feasible): the built-in rules, then the file's constraints."""
        values = config.to_dict()
        found = [rule(config, context) for rule in BUILT_IN_RULES]
        found += [c.violation(values) for c in self.constraints]
        return [reason for reason in found if reason is not None]


# ---- loading ----

def shipped_spaces() -> list[str]:
    """Names of the search space files that ship with tuner."""
    return sorted(entry.name.removesuffix(".yaml") for entry in resources.files("tuner.search_spaces").iterdir()
                  if entry.name.endswith(".yaml"))


def load_space(path_or_name: str | Path) -> SearchSpace:
    """Load and validate a search space file: a path, or the bare name of a shipped one (`default`).

    Any fault is a TunerError of one line naming the file and the key."""
    if isinstance(path_or_name, str) and path_or_name in shipped_spaces():
        source = resources.files("tuner.search_spaces") / f"{path_or_name}.yaml"
        path = Path(str(source))
        text = source.read_text(encoding="utf-8")
    else:
        path = Path(path_or_name)
        if not path.is_file():
            raise TunerError(f"{path}: no such search space file (shipped: {', '.join(shipped_spaces())})")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TunerError(f"{path}: cannot read ({exc})") from None
    return parse_space(text, path)


def parse_space(text: str, source: Path) -> SearchSpace:
    """A space from text already read (a study's stored copy); `source` names it in errors, as in load_space."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise _located(source, "", f"invalid YAML{where}: {problem}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise _located(source, "", "invalid YAML: nested too deeply") from None
    try:
        file = SpaceFile.model_validate(data)
    except ValidationError as exc:
        raise _located(source, *_explained(exc.errors()[0])) from None
    return SearchSpace(name=source.stem if file.name is None else file.name, description=file.description,
                       path=source, text=text, fixed=file.fixed, parameters=file.parameters,
                       constraints=tuple(file.constraints))


# ---- pydantic's errors as one line: the key as the file spells it, and what was wrong ----

# What the file should have held, by pydantic's error type; the line reads `expected <this>, got <value>`.
_EXPECTED = {
    "int_type": "an integer", "float_type": "a number", "finite_number": "a number", "bool_type": "true or false",
    "string_type": "a string", "list_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    # `choices` is the format's only tuple, and may not be empty.
    "tuple_type": "a non-empty list of values", "too_short": "a non-empty list of values",
}


def _explained(error: ErrorDetails) -> tuple[str, str]:
    """The key an error is about, as the file spells it, and what was wrong there."""
    key, record = _key_and_record(error["loc"])
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "space_format":
        return _joined(key, ctx["key"]), ctx["message"]
    if kind in ("extra_forbidden", "invalid_key"):
        tag = _tag(record) if record is not None else None
        for_type = f" for type {tag}" if tag is not None else ""
        return key, f"unknown key{for_type}; known: {', '.join(record.model_fields if record is not None else ())}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        types = ", ".join(str(_tag(member)) for member in get_args(get_args(Parameter)[0]))
        return _joined(key, "type"), f"expected one of {types}, got {_shown(ctx.get('tag'))}"
    if kind == "missing":
        return key, "missing"
    if kind == "greater_than":
        return key, f"must be above {ctx['gt']}, got {_shown(error['input'])}"
    if kind in _EXPECTED:
        return key, f"expected {_EXPECTED[kind]}, got {_shown(error['input'])}"
    return key, error["msg"]


def _key_and_record(loc: tuple[int | str, ...]) -> tuple[str, type[BaseModel] | None]:
    """`loc` as the file spells the key (`parameters.max_num_seqs.low`, `constraints[0]`), and the record that
    holds its last part (None: a mapping or list). Walks SpaceFile's annotations: pydantic's loc also holds
    the `type` tag of a parameter, which is not a key, and `[key]` where a mapping's key itself is wrong."""
    key, record = "", None
    node: Any = SpaceFile
    for part in loc:
        if part == "[key]":
            break
        if get_origin(node) is Annotated:
            node = get_args(node)[0]
        record = node if isinstance(node, type) and issubclass(node, BaseModel) else None
        if record is not None:
            field = record.model_fields.get(str(part))
            node = field.annotation if field is not None else None
        elif get_origin(node) in (Union, UnionType):  # the parameter union: `part` is the type tag
            node = next(member for member in get_args(node) if _tag(member) == part)
            continue
        elif get_origin(node) in (list, tuple):
            key += f"[{part}]"
            node = get_args(node)[0]
            continue
        else:
            node = get_args(node)[1] if get_origin(node) is dict else None
        key += f".{part}"
    return key.removeprefix("."), record


def _joined(key: str, more: str | None) -> str:
    if not more:
        return key
    return f"{key}{more}" if more.startswith("[") or not key else f"{key}.{more}"


def _located(path: Path, key: str, message: str) -> TunerError:
    """The one line of a broken file: `PATH: KEY: MESSAGE`."""
    key = key if key.isprintable() else repr(key)  # a key with a line break must not break the line
    return TunerError(f"{path}: {key}: {message}" if key else f"{path}: {message}")


def _shown(value: Any) -> str:
    """A YAML value as the user wrote it, for error messages."""
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return repr(value)
