"""``--set key.path=value`` overrides, applied to a spec's raw mapping before validation."""

from __future__ import annotations

from typing import Any

from jobs.errors import FieldPath, SpecError, format_field_path
from jobs.secrets import shown_setting
from jobs.yaml_reader import parse_yaml_value


def parse_override(text: str) -> tuple[FieldPath, Any]:
    """Split ``workload.train.epochs=3`` into its field path and its value (parsed as YAML).

    Raises:
        SpecError: no ``=``, an empty key part, or a value that is not valid YAML.
    """
    source = f"--set {shown_setting(text)}"
    key, sep, raw_value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError.single(source, "expected KEY=VALUE, e.g. --set workload.train.epochs=3")
    parts: list[str | int] = []
    for part in key.split("."):
        if not part:
            raise SpecError.single(source, f"{key!r} has an empty part; write dotted keys like workload.train.epochs")
        parts.append(int(part) if part.isdigit() else part)
    try:
        return tuple(parts), parse_yaml_value(raw_value, source)
    except SpecError:
        if source == f"--set {text}":
            raise
        # YAML's own message may quote the value, which the source masks: a secret's error says nothing of it.
        raise SpecError.single(source, "the value is not a plain YAML value (not shown: it looks secret)") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[FieldPath, str]:
    """Apply ``--set`` overrides to ``data`` in place; return which paths each one set.

    Missing mappings along the path are created; a number indexes into an existing list.

    Raises:
        SpecError: an override that cannot be parsed or applied (names the ``--set``).
    """
    applied: dict[FieldPath, str] = {}
    for text in overrides:
        path, value = parse_override(text)
        source = f"--set {shown_setting(text)}"
        target: Any = data
        for depth, part in enumerate(path[:-1]):
            target = _step(target, part, path[: depth + 1], source)
        last = path[-1]
        if isinstance(target, list):
            if not isinstance(last, int) or last > len(target):
                raise SpecError.single(source, f"{format_field_path(path[:-1])} is a list; index it with 0..{len(target)}")
            if last == len(target):
                target.append(value)
            else:
                target[last] = value
        elif isinstance(target, dict):
            target[str(last)] = value
        else:
            raise SpecError.single(source, f"{format_field_path(path[:-1])} is a single value, not a mapping")
        applied[path] = source
    return applied


def _step(target: Any, part: str | int, path: FieldPath, source: str) -> Any:
    if isinstance(target, list):
        if isinstance(part, int) and part < len(target):
            return target[part]
        raise SpecError.single(source, f"{format_field_path(path[:-1])} is a list of {len(target)}; "
                                       f"{part!r} is not an index in it")
    if not isinstance(target, dict):
        raise SpecError.single(source, f"{format_field_path(path[:-1])} is a single value, not a mapping")
    key = str(part)
    if key not in target or target[key] is None:
        target[key] = {}
    return target[key]
