"""The search space file format: one record, SpaceFile, of the settings a study fixes, those it searches and the
constraints between them. Its JSON Schema is published as search_spaces/schema.json (tests/unit/test_search_spaces.py
keeps the two equal)."""

from __future__ import annotations

from typing import Any, Self

from pydantic import ConfigDict, Field, StrictStr, field_validator, model_validator

from tuner.search_spaces.constraints import Constraint
from tuner.search_spaces.messages import refused
from tuner.search_spaces.parameters import Parameter
from tuner.search_spaces.settings import Record, Scalar, Setting, Value, engine_value

_SECTIONS = ("fixed", "parameters", "constraints")


class SpaceFile(Record):
    """A search space file for tuner: the vLLM settings a study fixes, those it searches, and the constraints
    between them; a setting is either fixed or searched."""

    model_config = ConfigDict(title="tuner search space", json_schema_extra={
        "$schema": "https://json-schema.org/draft/2020-12/schema"})

    name: StrictStr | None = Field(None, description="the space's name; unset: the file's name without .yaml")
    description: StrictStr = ""
    fixed: dict[Setting, Value] = Field(default_factory=dict, description="settings every trial runs with")
    parameters: dict[Setting, Parameter] = Field(default_factory=dict, description="settings searched")
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
        return {name: engine_value(name, value, name) for name, value in fixed.items()}

    @field_validator("parameters")
    @classmethod
    def _parameters_as_engine_takes_them(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        return {name: parameter.for_setting(name) for name, parameter in parameters.items()}

    @model_validator(mode="after")
    def _fixed_or_searched(self) -> Self:
        both = [name for name in self.parameters if name in self.fixed]
        if both:
            raise refused("is also fixed; a setting is either fixed or searched", f"parameters.{both[0]}")
        return self
