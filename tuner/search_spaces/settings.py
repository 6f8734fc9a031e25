"""The engine settings a space file names and the values it gives them, as EngineConfig takes them; the base of
the file format's records."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from tuner.common.errors import TunerError
from tuner.search_spaces.messages import refused, refused_as, shown
from tuner.workers.engine_config import EngineConfig

Scalar = bool | int | float | str

# "int", "float", "bool" or "str" for every EngineConfig field (its annotations are strings like "int | None").
SETTING_KINDS = {f.name: str(f.type).split(" |")[0] for f in fields(EngineConfig)}

# A value as YAML writes it; EngineConfig then reads it as its setting's type (`fixed` and `choices`).
Value = Annotated[StrictBool | StrictInt | StrictFloat | StrictStr,
                  refused_as(lambda value: f"expected a single value, got {shown(value)}")]
# The name of an EngineConfig field (taken from EngineConfig, so that a new field is a new setting at once).
if TYPE_CHECKING:
    Setting = str
else:
    Setting = Annotated[Literal[tuple(SETTING_KINDS)],
                        refused_as(lambda _: f"unknown engine setting; known: {', '.join(SETTING_KINDS)}")]


def engine_value(name: str, value: Scalar, key: str) -> Scalar:
    """`value` as EngineConfig stores setting `name`; EngineConfig's own message, at `key`, if it refuses it."""
    try:
        return getattr(EngineConfig.from_dict({name: value}), name)
    except TunerError as exc:
        raise refused(str(exc), key) from None


class Record(BaseModel):
    """A record of the file format: unknown keys refused, frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
