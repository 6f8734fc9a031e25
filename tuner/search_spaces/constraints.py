"""Constraints between settings: `NAME OP VALUE` comparisons, tokenized by hand and never evaluated as code, and
the file's `constraints` records (`require`, optionally `when`)."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from tuner.common.errors import TunerError
from tuner.search_spaces.messages import refused
from tuner.search_spaces.settings import SETTING_KINDS, Record, Scalar
from tuner.workers.engine_config import EngineConfig

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
            kind = SETTING_KINDS[self.field]
            return "number" if kind in ("int", "float") else kind
        if isinstance(self.literal, bool):
            return "bool"
        return "str" if isinstance(self.literal, str) else "number"

    def value(self, values: dict[str, Any]) -> Any:
        """Its value in the configuration `values`: the named field's (None when unset) or the literal."""
        return values.get(self.field) if self.field is not None else self.literal


@dataclass(frozen=True)
class Comparison:
    """`left OP right`; `evaluate` is None when a field it names is unset."""

    left: Operand
    op: str
    right: Operand
    text: str

    def evaluate(self, values: dict[str, Any]) -> bool | None:
        """Whether it holds for `values`; None when a field it names is unset."""
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
        raise refused(str(exc)) from None


def _operand(kind: str, token: str) -> Operand:
    if kind == "string":
        return Operand(literal=token[1:-1])
    if kind == "number":
        return Operand(literal=float(token) if any(c in token for c in ".eE") else int(token))
    if token.lower() in ("true", "false"):
        return Operand(literal=token.lower() == "true")
    if token not in SETTING_KINDS:
        raise TunerError(f"unknown engine setting {token!r} (quote a string literal: '{token}'); "
                         f"known: {', '.join(SETTING_KINDS)}")
    return Operand(field=token)


class Constraint(Record):
    """`require` must hold whenever `when` does; a field unset in a configuration makes it not apply."""

    require: Comparison = Field(description="NAME OP VALUE, e.g. max_num_batched_tokens >= max_model_len")
    when: Comparison | None = Field(None, description="NAME OP VALUE: require applies only where this holds")

    def violation(self, values: dict[str, Any]) -> str | None:
        """Why the configuration `values` breaks this constraint, in one line; None when it holds, when `when` does not,
        or when a field it names is unset."""
        if self.when is not None and not self.when.evaluate(values):
            return None
        if self.require.evaluate(values) is not False:
            return None
        condition = f" (when {self.when.text})" if self.when is not None else ""
        return f"constraint {self.require.text}{condition} fails: {self.require.shown(values)}"
