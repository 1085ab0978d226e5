"""Every field of the workloads' parameter models says what it is for: editors show it from the JSON Schema."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel


def undescribed_fields(model: type[BaseModel], path: str = "", seen: set | None = None) -> list[str]:
    """Dotted names of the fields of ``model`` and of the models nested in it that have no description."""
    seen = set() if seen is None else seen
    if model in seen:
        return []
    seen.add(model)
    missing = []
    for name, field in model.model_fields.items():
        dotted = f"{path}{name}"
        if not (field.description or "").strip():
            missing.append(f"{model.__name__}.{name} ({dotted})")
        for nested in nested_models(field.annotation):
            missing += undescribed_fields(nested, f"{dotted}.", seen)
    return missing


def nested_models(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds: itself, or inside ``X | None``, ``list[X]``, ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in typing.get_args(annotation) for model in nested_models(argument)]


@pytest.mark.parametrize("target", ["workloads.vision.config:VisionParams", "workloads.hf_vit.config:HFViTParams"])
def test_every_workload_parameter_has_a_description(target):
    import importlib

    module, _, name = target.partition(":")
    model = getattr(importlib.import_module(module), name)
    assert undescribed_fields(model) == []


def test_the_walk_reaches_nested_models_and_finds_a_missing_description():
    from pydantic import Field

    class Inner(BaseModel):
        described: int = Field(0, description="yes")
        bare: int = 0

    class Outer(BaseModel):
        inner: Inner | None = Field(None, description="nested")
        items: list[Inner] = Field(default_factory=list, description="listed")

    assert undescribed_fields(Outer) == ["Inner.bare (inner.bare)"]
