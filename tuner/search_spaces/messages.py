"""A broken space file's one line, `PATH: KEY: MESSAGE`: the refusals the format's records raise with tuner's own
message, and pydantic's errors translated into the key as the file spells it and what was wrong there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import ErrorDetails, PydanticCustomError

from tuner.common.errors import TunerError


def refused(message: str, key: str | None = None) -> PydanticCustomError:
    """A check of the format that is more than a type: `message` about `key` (None: the record itself).

    The key is relative to the record being validated, so that an error found by a record's own validator
    still names the exact key in the file."""
    return PydanticCustomError("space_format", "{message}", {"key": key, "message": message})


def refused_as(message: Callable[[Any], str]) -> WrapValidator:
    """A type refused with one error of ours, `message(value)`, instead of pydantic's (one per member of a union,
    or a literal's every value)."""
    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise refused(message(value)) from None
    return WrapValidator(validate)


def shown(value: Any) -> str:
    """A YAML value as the user wrote it, for error messages."""
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return repr(value)


def _tag(record: type[BaseModel]) -> str | None:
    """The `type` a record of a tagged union (a parameter) is written with (None: not one)."""
    field = record.model_fields.get("type")
    return get_args(field.annotation)[0] if field is not None else None


def located(path: Path, key: str, message: str) -> TunerError:
    """The one line of a broken file: `PATH: KEY: MESSAGE`."""
    key = key if key.isprintable() else repr(key)  # a key with a line break must not break the line
    return TunerError(f"{path}: {key}: {message}" if key else f"{path}: {message}")


# What the file should have held, by pydantic's error type; the line reads `expected <this>, got <value>`.
_EXPECTED = {
    "int_type": "an integer", "float_type": "a number", "finite_number": "a number", "bool_type": "true or false",
    "string_type": "a string", "list_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    # `choices` is the format's only tuple, and may not be empty.
    "tuple_type": "a non-empty list of values", "too_short": "a non-empty list of values",
}


def explained(error: ErrorDetails, root: type[BaseModel]) -> tuple[str, str]:
    """The key an error of validating `root` is about, as the file spells it, and what was wrong there."""
    key, record, node = _walk(error["loc"], root)
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "space_format":
        return _joined(key, ctx["key"]), ctx["message"]
    if kind in ("extra_forbidden", "invalid_key"):
        written_as = _tag(record) if record is not None else None
        for_type = f" for type {written_as}" if written_as is not None else ""
        return key, f"unknown key{for_type}; known: {', '.join(record.model_fields if record is not None else ())}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        types = ", ".join(str(_tag(member)) for member in get_args(node))
        return _joined(key, "type"), f"expected one of {types}, got {shown(ctx.get('tag'))}"
    if kind == "missing":
        return key, "missing"
    if kind == "greater_than":
        return key, f"must be above {ctx['gt']}, got {shown(error['input'])}"
    if kind in _EXPECTED:
        return key, f"expected {_EXPECTED[kind]}, got {shown(error['input'])}"
    return key, error["msg"]


def _walk(loc: tuple[int | str, ...], root: type[BaseModel]) -> tuple[str, type[BaseModel] | None, Any]:
    """`loc` as the file spells the key (`parameters.max_num_seqs.low`, `constraints[0]`), the record that holds
    its last part (None: a mapping or list), and the type found there. Walks the records' annotations from `root`:
    pydantic's loc also holds the `type` tag of a parameter, which is not a key, and `[key]` where a mapping's key
    itself is wrong."""
    key, record = "", None
    node: Any = root
    for part in loc:
        if part == "[key]":
            break
        node = _unannotated(node)
        record = node if isinstance(node, type) and issubclass(node, BaseModel) else None
        if record is not None:
            field = record.model_fields.get(str(part))
            node = field.annotation if field is not None else None
        elif get_origin(node) in (Union, UnionType):  # a tagged union: `part` is the type tag
            node = next(member for member in get_args(node) if _tag(member) == part)
            continue
        elif get_origin(node) in (list, tuple):
            key += f"[{part}]"
            node = get_args(node)[0]
            continue
        else:
            node = get_args(node)[1] if get_origin(node) is dict else None
        key += f".{part}"
    return key.removeprefix("."), record, _unannotated(node)


def _unannotated(node: Any) -> Any:
    """`node` without its Annotated metadata."""
    return get_args(node)[0] if get_origin(node) is Annotated else node


def _joined(key: str, more: str | None) -> str:
    if not more:
        return key
    return f"{key}{more}" if more.startswith("[") or not key else f"{key}.{more}"
