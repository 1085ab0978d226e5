"""Loading a spec file: read YAML, apply ``--set`` overrides, validate, resolve paths."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from jobs.errors import FieldPath, Problem, SpecError, did_you_mean
from jobs.overrides import apply_overrides
from jobs.paths import SPEC_DIR_CONTEXT_KEY
from jobs.spec import JobSpec
from jobs.strict import field_names_at
from jobs.sweep import SweepSpec, check_sweep
from jobs.workload_contract import workload_needs
from jobs.workload_kinds import BUILTIN_WORKLOADS, workload_model
from jobs.yaml_reader import read_yaml_mapping


@dataclass
class LoadedSpec:
    """A validated spec and where it came from: its file, and which fields a ``--set`` gave."""

    path: Path | None
    spec: JobSpec
    workload_kind: str | None = None
    workload: BaseModel | None = None
    overrides: list[str] = field(default_factory=list)
    set_by: dict[FieldPath, str] = field(default_factory=dict)  # field path -> the ``--set …`` that gave it

    def source_of(self, *path: str) -> str:
        """Where a field's value came from, for messages: ``--set address=…`` or ``'address' in FILE``."""
        return self.set_by.get(tuple(path)) or f"'{'.'.join(path)}' in {self.file}"

    @property
    def file(self) -> str:
        """The spec's file name for messages (``<spec>`` for a spec given as data)."""
        return str(self.path) if self.path else "<spec>"


def load_spec(path: str | Path, overrides: list[str] | None = None) -> LoadedSpec:
    """Read, override and validate a spec file.

    Args:
        path: the spec's YAML file; relative paths inside it are anchored at its folder.
        overrides: ``--set`` texts such as ``workload.train.epochs=3``, applied before validation.

    Returns:
        The validated spec with its workload parameters and where each field came from.

    Raises:
        SpecError: the file cannot be read or parsed, or a field is invalid; the message names file,
            line and field of every problem.
    """
    path = Path(path)
    data, lines = read_yaml_mapping(path)
    return validate_spec_data(data, path, lines, overrides or [])


def validate_spec_data(
    data: dict[str, Any],
    path: Path | None,
    lines: dict[FieldPath, int] | None = None,
    overrides: list[str] | None = None,
) -> LoadedSpec:
    """Validate an already parsed spec mapping, as :func:`load_spec` does after reading the file.

    Args:
        data: the parsed mapping; overrides are applied to it in place.
        path: the file it came from (anchors relative paths; None: the working directory).
        lines: the line of each field, for messages.
        overrides: ``--set`` texts.

    Returns:
        The validated spec.

    Raises:
        SpecError: one or more fields are invalid.
    """
    file = str(path) if path else None
    overrides = list(overrides or [])
    from_cli = apply_overrides(data, overrides)
    context = {SPEC_DIR_CONTEXT_KEY: (path.parent.resolve() if path else Path.cwd())}
    locate = Locator(file, data, lines or {}, from_cli)
    problems: list[Problem] = []
    spec = None
    try:
        spec = JobSpec.model_validate(data, context=context)
    except ValidationError as exc:
        problems += locate.error(exc, JobSpec).problems

    # The workload section is checked even when the rest has errors, so one run shows them all.
    kind, workload = None, None
    raw_workload = data.get("workload")
    if isinstance(raw_workload, dict):
        try:
            kind, workload = _validate_workload(raw_workload, context, locate)
        except SpecError as exc:
            problems += exc.problems
    if spec is not None and spec.sweep is not None and not problems:
        problems += _check_sweep(spec.sweep, raw_workload, kind, workload, context, locate)
    if problems or spec is None:
        raise SpecError(file, problems)
    return LoadedSpec(path, spec, kind, workload, overrides, from_cli)


def _check_sweep(sweep: SweepSpec, raw_workload: Any, kind: str | None, workload: BaseModel | None,
                 context: dict[str, Any], locate: Locator) -> list[Problem]:
    if workload is None or kind is None:
        return [locate.problem(("sweep",), "sweeps a workload's fields, and this spec has no workload section")]
    needs = workload_needs(workload)
    raw = {key: value for key, value in raw_workload.items() if key != "kind"}
    found = check_sweep(sweep, raw, type(workload), needs.sweepable, needs.metrics, context)
    return [locate.problem(problem.path, problem.message) for problem in found]


def _validate_workload(
    raw: dict[str, Any], context: dict[str, Any], locate: Locator
) -> tuple[str, BaseModel]:
    params = dict(raw)
    kind = params.pop("kind", None)
    if not isinstance(kind, str) or not kind:
        known = ", ".join(sorted(BUILTIN_WORKLOADS))
        raise locate.error_at(("workload", "kind"), f"is required: one of {known}, or 'package.module:Model'")
    try:
        model = workload_model(kind)
    except ValueError as exc:
        raise locate.error_at(("workload", "kind"), str(exc)) from None
    try:
        return kind, model.model_validate(params, context=context)
    except ValidationError as exc:
        raise locate.error(exc, model, prefix=("workload",)) from None


class Locator:
    """Turns pydantic errors into ``Problem``s with field paths, lines and hints."""

    def __init__(self, file: str | None, data: dict[str, Any], lines: dict[FieldPath, int],
                 from_cli: dict[FieldPath, str]) -> None:
        self.file, self.data, self.lines, self.from_cli = file, data, lines, from_cli

    def problem(self, path: FieldPath, message: str) -> Problem:
        source = next((src for cli_path, src in self.from_cli.items() if path[: len(cli_path)] == cli_path), None)
        line = None
        for depth in range(len(path), -1, -1):
            line = self.lines.get(path[:depth])
            if line is not None:
                break
        return Problem(message, path, line, source)

    def error_at(self, path: FieldPath, message: str) -> SpecError:
        return SpecError(self.file, [self.problem(path, message)])

    def error(self, exc: ValidationError, model: type[BaseModel], prefix: FieldPath = ()) -> SpecError:
        found: dict[FieldPath, list[str]] = {}
        for detail in exc.errors(include_url=False):
            data_path = self._data_path(prefix, detail["loc"])
            found.setdefault(data_path, []).append(self._message(detail, model, data_path[len(prefix):]))
        # A value that matches none of a union's forms yields one error per form; the
        # ones that reached deeper into the value say more, so shallower ones are dropped.
        paths = [p for p in found if not any(len(q) > len(p) and q[: len(p)] == p for q in found)]
        problems = []
        for data_path in sorted(paths, key=lambda p: (self.lines.get(p, 0), str(p))):
            messages = list(dict.fromkeys(found[data_path]))
            message = messages[0] if len(messages) == 1 else "does not match any accepted form: " + "; or ".join(messages)
            problems.append(self.problem(data_path, message))
        return SpecError(self.file, problems)

    def _data_path(self, prefix: FieldPath, loc: tuple[Any, ...]) -> FieldPath:
        # pydantic puts union member names ("list[str]", "PipConfig") into locations;
        # keep only the parts that exist in the data (or, at the end, name a missing key).
        node: Any = self._at(prefix)
        path: list[Any] = list(prefix)
        for index, part in enumerate(loc):
            last = index == len(loc) - 1
            if isinstance(node, dict) and part in node:
                node = node[part]
                path.append(part)
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
                path.append(part)
            elif isinstance(part, str) and last and isinstance(node, dict):
                path.append(part)  # a required key that is missing
        return tuple(path)

    def _at(self, path: FieldPath) -> Any:
        node: Any = self.data
        for part in path:
            node = node[part] if isinstance(node, dict) else node
        if path and path[0] == "workload" and isinstance(node, dict):
            node = {k: v for k, v in node.items() if k != "kind"}
        return node

    def _message(self, detail: dict[str, Any], model: type[BaseModel], path: FieldPath) -> str:
        kind = detail["type"]
        if kind == "extra_forbidden":
            allowed = field_names_at(model, path[:-1])
            return f"unknown field{did_you_mean(str(path[-1]), allowed)}" if path else "unknown field"
        if kind == "missing":
            return "is required"
        message = detail["msg"]
        if message.startswith("Value error, "):
            return message[len("Value error, "):]
        if kind in ("literal_error", "enum"):
            return f"{message} (got {detail.get('input')!r})"
        if "input" in detail and not isinstance(detail["input"], (dict, list)):
            return f"{message} (got {detail['input']!r})"
        return message
