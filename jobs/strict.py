"""The base of every rayjobs settings model: unknown keys are errors, defaults are validated too."""

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A pydantic model that refuses unknown fields, so a misspelled key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        args = typing.get_args(annotation)
        args = args[:1] if origin is typing.Annotated else args
        return [model for arg in args for model in _models_in(arg)]
    return []


def field_names_at(model: type[BaseModel], path: tuple[Any, ...]) -> set[str]:
    """Field names of the model(s) that validate the mapping at ``path`` of ``model`` (for "did you mean")."""
    models = [model]
    for part in path:
        models = [inner for m in models if isinstance(part, str) and part in m.model_fields
                  for inner in _models_in(m.model_fields[part].annotation)]
    return {name for m in models for name in m.model_fields}
