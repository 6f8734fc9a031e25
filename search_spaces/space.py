"""Search spaces: YAML files declaring which vLLM settings a study searches, and which proposals are infeasible.

A file names settings that are `fixed` (always set), `parameters` (searched: int, float or categorical) and
`constraints` between settings (`NAME OP VALUE`, optionally `when: NAME OP VALUE`). Every proposal is also
checked against the built-in rules below, before any launch, so an impossible configuration costs no trial.
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
from typing import TYPE_CHECKING, Any

import optuna
import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

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
_TOP_KEYS = ("name", "description", "fixed", "parameters", "constraints")
_PARAMETER_KEYS = {"int": ("type", "low", "high", "step", "log"), "float": ("type", "low", "high", "step", "log"),
                   "categorical": ("type", "choices")}
_CONSTRAINT_KEYS = ("require", "when")


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


@dataclass(frozen=True)
class Constraint:
    """`require` must hold whenever `when` does; a field unset in a configuration makes it not apply."""

    require: Comparison
    when: Comparison | None = None

    def violation(self, values: dict[str, Any]) -> str | None:
        if self.when is not None and not self.when.evaluate(values):
            return None
        if self.require.evaluate(values) is not False:
            return None
        condition = f" (when {self.when.text})" if self.when is not None else ""
        return f"constraint {self.require.text}{condition} fails: {self.require.shown(values)}"


# ---- parameters ----

@dataclass(frozen=True)
class IntParameter:
    """An integer, uniform over [low, high] on a grid of `step`, or on a log scale."""

    name: str
    low: int
    high: int
    step: int = 1
    log: bool = False

    def distribution(self) -> IntDistribution:
        return IntDistribution(self.low, self.high, log=self.log, step=self.step)

    def suggest(self, trial: optuna.trial.Trial) -> int:
        return trial.suggest_int(self.name, self.low, self.high, step=self.step, log=self.log)


@dataclass(frozen=True)
class FloatParameter:
    """A float over [low, high], continuous, on a grid of `step`, or on a log scale."""

    name: str
    low: float
    high: float
    step: float | None = None
    log: bool = False

    def distribution(self) -> FloatDistribution:
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def suggest(self, trial: optuna.trial.Trial) -> float:
        value = trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)
        if self.step is None:
            return value
        # Optuna's grid is low + k * step in binary floating point (0.7500000000000001): round it to the
        # step's own decimals, so that the vllm serve command reads as the grid was written.
        decimals = max(0, -Decimal(str(self.step)).normalize().as_tuple().exponent)
        return round(value, decimals)


@dataclass(frozen=True)
class CategoricalParameter:
    """One of a list of values."""

    name: str
    choices: tuple[Scalar, ...]

    def distribution(self) -> CategoricalDistribution:
        return CategoricalDistribution(self.choices)

    def suggest(self, trial: optuna.trial.Trial) -> Scalar:
        return trial.suggest_categorical(self.name, self.choices)


Parameter = IntParameter | FloatParameter | CategoricalParameter


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
        return EngineConfig(**self.fixed, **{name: p.suggest(trial) for name, p in self.parameters.items()})

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
    """Load and validate a search space file: a path, or the bare name of a shipped one (`default`)."""
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
    return _Parser(path).space(text)


def parse_space(text: str, source: Path) -> SearchSpace:
    """A space from text already read (a study's stored copy); `source` names it in errors."""
    return _Parser(source).space(text)


class _Parser:
    """Validation of one file; every error names the file and the offending key."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, key: str, message: str) -> TunerError:
        key = key if key.isprintable() else repr(key)  # a key with a line break must not break the line
        return TunerError(f"{self.path}: {key}: {message}" if key else f"{self.path}: {message}")

    def space(self, text: str) -> SearchSpace:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
            raise self.error("", f"invalid YAML{where}: {problem}") from None
        except RecursionError:  # PyYAML composes nested collections recursively
            raise self.error("", "invalid YAML: nested too deeply") from None
        data = self.mapping("", data)
        unknown = [key for key in data if key not in _TOP_KEYS]
        if unknown:
            raise self.error(str(unknown[0]), f"unknown key; known: {', '.join(_TOP_KEYS)}")
        fixed = {name: self.value(f"fixed.{name}", name, value)
                 for name, value in self.settings("fixed", data.get("fixed")).items()}
        parameters = {}
        for name, spec in self.settings("parameters", data.get("parameters")).items():
            if name in fixed:
                raise self.error(f"parameters.{name}", "is also fixed; a setting is either fixed or searched")
            parameters[name] = self.parameter(f"parameters.{name}", name, spec)
        return SearchSpace(
            name=self.text("name", data.get("name", self.path.stem)),
            description=self.text("description", data.get("description", "")),
            path=self.path, text=text, fixed=fixed, parameters=parameters,
            constraints=self.constraints(data.get("constraints")),
        )

    def mapping(self, key: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {_shown(value)}")
        return value

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {_shown(value)}")
        return value

    def settings(self, key: str, value: Any) -> dict[str, Any]:
        """A mapping keyed by EngineConfig field names; absent or empty is no settings."""
        settings = self.mapping(key, {} if value is None else value)
        for name in settings:
            if name not in _FIELD_KINDS:
                raise self.error(f"{key}.{name}", f"unknown engine setting; known: {', '.join(_FIELD_KINDS)}")
        return settings

    def value(self, key: str, name: str, value: Any) -> Scalar:
        """The value as EngineConfig stores it; EngineConfig's own error, located, if it refuses it."""
        if value is None or isinstance(value, (list, dict)):
            raise self.error(key, f"expected a single value, got {_shown(value)}")
        try:
            return getattr(EngineConfig.from_dict({name: value}), name)
        except TunerError as exc:
            raise self.error(key, str(exc)) from None

    def parameter(self, key: str, name: str, spec: Any) -> Parameter:
        spec = self.mapping(key, spec)
        kind = spec.get("type")
        if kind not in _PARAMETER_KEYS:
            raise self.error(f"{key}.type", f"expected one of {', '.join(_PARAMETER_KEYS)}, got {_shown(kind)}")
        unknown = [k for k in spec if k not in _PARAMETER_KEYS[kind]]
        if unknown:
            raise self.error(f"{key}.{unknown[0]}", f"unknown key for type {kind}; "
                                                   f"known: {', '.join(_PARAMETER_KEYS[kind])}")
        if kind == "categorical":
            return CategoricalParameter(name, self.choices(f"{key}.choices", name, spec.get("choices")))
        if _FIELD_KINDS[name] != kind:
            raise self.error(f"{key}.type", f"{name} is a {_FIELD_KINDS[name]} setting; "
                                            f"use type {_FIELD_KINDS[name]} or categorical")
        return self.numeric(key, name, kind, spec)

    def numeric(self, key: str, name: str, kind: str, spec: dict) -> IntParameter | FloatParameter:
        low, high = (self.number(f"{key}.{bound}", spec.get(bound), kind) for bound in ("low", "high"))
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise self.error(f"{key}.log", f"expected true or false, got {_shown(log)}")
        step = spec.get("step")
        if low > high:
            raise self.error(key, f"low ({low}) is above high ({high})")
        if log and low <= 0:
            raise self.error(f"{key}.low", f"a log scale needs low above 0, got {low}")
        if step is not None and log:
            raise self.error(f"{key}.step", "step and log cannot be combined")
        for bound, value in (("low", low), ("high", high)):
            self.value(f"{key}.{bound}", name, value)
        if step is not None:
            step = self.number(f"{key}.step", step, kind)
            if step <= 0:
                raise self.error(f"{key}.step", f"must be above 0, got {step}")
            steps = (high - low) / step
            if not math.isfinite(steps):
                raise self.error(f"{key}.step", f"{step} is too small for the range {low} to {high}")
            if not math.isclose(steps, round(steps), abs_tol=1e-9):
                raise self.error(f"{key}.high", f"high ({high}) is not low ({low}) plus a whole number of steps ({step})")
        if kind == "int":
            return IntParameter(name, low, high, step=1 if step is None else step, log=log)
        return FloatParameter(name, float(low), float(high), step=None if step is None else float(step), log=log)

    def number(self, key: str, value: Any, kind: str) -> int | float:
        wanted = (int,) if kind == "int" else (int, float)
        if isinstance(value, bool) or not isinstance(value, wanted) or not math.isfinite(value):
            raise self.error(key, f"expected {'an integer' if kind == 'int' else 'a number'}, got {_shown(value)}")
        return value

    def choices(self, key: str, name: str, value: Any) -> tuple[Scalar, ...]:
        if not isinstance(value, list) or not value:
            raise self.error(key, f"expected a non-empty list of values, got {_shown(value)}")
        choices = tuple(self.value(f"{key}[{i}]", name, choice) for i, choice in enumerate(value))
        repeated = [c for i, c in enumerate(choices) if c in choices[:i]]
        if repeated:
            raise self.error(key, f"{repeated[0]!r} is listed twice")
        return choices

    def constraints(self, value: Any) -> tuple[Constraint, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error("constraints", f"expected a list, got {_shown(value)}")
        parsed = []
        for i, item in enumerate(value):
            key = f"constraints[{i}]"
            item = self.mapping(key, item)
            unknown = [k for k in item if k not in _CONSTRAINT_KEYS]
            if unknown:
                raise self.error(f"{key}.{unknown[0]}", f"unknown key; known: {', '.join(_CONSTRAINT_KEYS)}")
            if "require" not in item:
                raise self.error(f"{key}.require", "missing")
            when = self.comparison(f"{key}.when", item["when"]) if "when" in item else None
            parsed.append(Constraint(self.comparison(f"{key}.require", item["require"]), when))
        return tuple(parsed)

    def comparison(self, key: str, value: Any) -> Comparison:
        text = self.text(key, value)
        try:
            return parse_comparison(text)
        except TunerError as exc:
            raise self.error(key, str(exc)) from None


def _shown(value: Any) -> str:
    """A YAML value as the user wrote it, for error messages."""
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return repr(value)
