"""``run.json`` read field by field: one typed model, built from the record's own field list, that every reader
goes through before it uses a record.

The model is the published schema (``rayjobs_agent/record_layout.json_schema()``, made from ``RUN_FIELDS`` and
``ATTEMPT_FIELDS``) turned into pydantic models, strictly: a field holds one of the JSON types its entry names,
a number is a finite one, and nothing is coerced, so a record that passes is the very document that was read.
Fields the model does not know are kept (a newer minor version adds them).

Three rules hold besides the types, because readers build on them:

- an attempt's ``submission_id`` names the folders of its log and events inside the run's folder, so it must be
  one folder's name (:func:`name_problem`): ``../../etc`` never reaches a path;
- a pipeline job's run id and job names (``pipeline``) are one name each, as a submission id is;
- the spec's secrets are found by ``runtime_env.env_vars`` and ``secret_env_vars``; a spec whose secrets cannot
  be found cannot be masked, and so is not shown.

A record that breaks either, or a type, is unreadable, and :func:`record_problem` says which field holds what.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from rayjobs_agent.record_layout import ATTEMPTS_FIELD, PIPELINE_FIELD, json_schema

# A file or folder name longer than this cannot exist on the filesystems records live on (Linux's NAME_MAX).
MAX_NAME_BYTES = 255
# A value quoted in a reason is cut here: the reason is one line in a table.
_SHOWN_CHARS = 60
# A record or event nests a few levels; one nested deeper than this is no record, and would exhaust the stack of
# every reader that walks it (masking walks every string).
MAX_DEPTH = 64


def name_problem(name: str) -> str | None:
    """Why ``name`` is not one file's or folder's name inside a folder, local or in S3 (None when it is).

    A name is not empty, not ``.`` or ``..``, holds no ``/`` or ``\\`` (no path of its own), no NUL or other
    control character, and fits a filesystem's name (255 bytes).
    """
    if not isinstance(name, str) or not name:
        return "it is empty"
    if name in (".", ".."):
        return f"{name!r} leads out of the folder"
    if "/" in name or "\\" in name:
        return "it holds a path separator"
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        return "it holds a control character"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return None


def path_problem(path: str) -> str | None:
    """Why ``path`` (``a/b/c``, inside a folder) could lead anywhere but inside it (None when it cannot): every
    part one name by :func:`name_problem`, no leading ``/``, no empty part."""
    if not isinstance(path, str) or not path:
        return "it is empty"
    for part in path.split("/"):
        if (problem := name_problem(part)) is not None:
            return f"{part!r}: {problem}" if part else "it has an empty part (a leading, trailing or double '/')"
    return None


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests objects and arrays more than ``limit`` levels deep; walked without
    recursion, so that the walk itself cannot exhaust the stack."""
    level = [value]
    for _ in range(limit):
        level = [item for container in level if isinstance(container, (dict, list))
                 for item in (container.values() if isinstance(container, dict) else container)]
        if not level:
            return False
    return any(isinstance(item, (dict, list)) for item in level)


def _one_name(value: str) -> str:
    if (problem := name_problem(value)) is not None:
        raise ValueError(f"which is no folder's name ({problem})")
    return value


def _no_control_character(value: str) -> str:
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise ValueError("which holds a control character")
    return value


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class RuntimeEnv(_Record):
    """What of a recorded spec's ``runtime_env`` masking reads: its variables, each a string."""

    env_vars: dict[str, str] | None = None


class RecordedSpec(_Record):
    """What of a recorded spec masking reads: where its secrets are; every other field is kept as it is."""

    runtime_env: RuntimeEnv | None = None
    secret_env_vars: list[str] | None = None


# The reader's own rules, by where they hold in the record (an attempt's fields are under "attempts").
_REFINED: dict[tuple[str, ...], Any] = {
    (ATTEMPTS_FIELD, "submission_id"): Annotated[str, AfterValidator(_one_name)],
    ("spec",): RecordedSpec | None,
    # A pipeline's run id and job names are printed, matched against a URL and drawn: one name each, and the run
    # folders of the jobs it ran after are shown as they are, so never with a terminal's control characters.
    (PIPELINE_FIELD, "run"): Annotated[str, AfterValidator(_one_name)],
    (PIPELINE_FIELD, "job"): Annotated[str, AfterValidator(_one_name)],
    (PIPELINE_FIELD, "after"): dict[Annotated[str, AfterValidator(_one_name)],
                                    Annotated[str, AfterValidator(_no_control_character)]] | None,
}
_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "object": dict[str, Any], "array": list[Any],
                               "null": None, "boolean": bool,
                               "number": Annotated[float, Field(allow_inf_nan=False)]}
_WORDS = {"string": "a string", "integer": "an integer", "number": "a number", "object": "an object",
          "array": "an array", "null": "null", "boolean": "true or false"}


def _python_type(rule: dict[str, Any], where: tuple[str, ...], name: str) -> Any:
    if where in _REFINED:
        return _REFINED[where]
    kinds = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
    types = []
    for kind in kinds:
        if kind == "object" and "properties" in rule:
            types.append(_model(rule, where, name))
        elif kind == "array" and "items" in rule:
            # The model of an item is named for one of them: "attempts" holds Attempt.
            types.append(list[_python_type(rule["items"], where, name.removesuffix("s").title())])  # type: ignore[misc]
        else:
            types.append(_JSON_TYPES[kind])
    nullable = None in types
    union = None
    for kind in (kind for kind in types if kind is not None):
        union = kind if union is None else union | kind
    if union is None:
        return None
    return union | None if nullable else union


def _model(rule: dict[str, Any], where: tuple[str, ...], name: str) -> type[BaseModel]:
    required = set(rule.get("required", ()))
    fields = {field: (_python_type(sub, (*where, field), field), ... if field in required else None)
              for field, sub in rule["properties"].items()}
    return create_model(name, __base__=_Record, **fields)  # type: ignore[call-overload]


@cache
def run_record_model() -> type[BaseModel]:
    """The typed model of ``run.json``, made once from the published schema."""
    return _model(json_schema(), (), "RunRecord")


def record_problem(document: Any) -> str | None:
    """What makes ``document`` (a parsed ``run.json``) unreadable, naming the field and what it holds; None when
    every field holds what the model says."""
    if too_deep(document):
        return f"it nests objects and arrays more than {MAX_DEPTH} levels deep"
    try:
        run_record_model().model_validate(document)
    except ValidationError as exc:
        return _reason(exc.errors()[0], document)
    return None


def _reason(error: Any, document: Any) -> str:
    location = tuple(error["loc"])
    where = "".join(f"[{part}]" if isinstance(part, int) else (f".{part}" if index else str(part))
                    for index, part in enumerate(location)) or "the record"
    if error["type"] == "missing":
        return f"{where} is missing"
    held = _shown(error.get("input"), secret=location[:1] == ("spec",))
    if error["type"] == "value_error":
        return f"{where} holds {held}, {error['ctx']['error']}"
    return f"{where} holds {held}, not {_expected(location, error['type'])}"


def _expected(location: tuple[Any, ...], error_type: str) -> str:
    """The JSON types the schema names at ``location`` (the spec's inner fields, outside it, by pydantic's word)."""
    rule: dict[str, Any] | None = json_schema()
    for part in location:
        if rule is None:
            break
        rule = rule.get("items") if isinstance(part, int) else (rule.get("properties") or {}).get(part)
    if rule is not None and (location[:1] != ("spec",) or len(location) == 1):
        kinds = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
        words = [_WORDS[kind] for kind in kinds]
        text = " or ".join(words)
        return f"a finite {text[2:]}" if error_type == "finite_number" and text.startswith("a number") else text
    return {"string_type": "a string", "dict_type": "an object", "model_type": "an object", "list_type": "an array",
            "int_type": "an integer", "float_type": "a number", "finite_number": "a finite number"}.get(
        error_type, error_type.replace("_", " "))


def _shown(value: Any, secret: bool) -> str:
    """A held value as a reason quotes it: a spec's values by their type only (one may be a secret)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if secret:
        return {str: "a string", bool: "true or false", type(None): "null"}.get(type(value), "a number")
    text = json.dumps(value, default=str)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 1] + "…"


__all__ = ["MAX_DEPTH", "MAX_NAME_BYTES", "RecordedSpec", "RuntimeEnv", "name_problem", "path_problem",
           "record_problem", "run_record_model", "too_deep"]
