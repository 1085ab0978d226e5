"""MkDocs hook: the spec reference page, written at build time from the JSON Schema ``rayjobs schema`` prints.

Every field of the spec and of every built-in workload's parameters gets a row: its dotted path, type,
default, description and an example. The page is generated, never edited, so it cannot drift from the
models. A field without a description is logged as a warning, which fails ``mkdocs build --strict``.

Examples come from the first place that has one: the field's own ``examples`` in its model, a value an
example spec in ``specs/`` sets (or shows commented out), a YAML block of a page, :data:`EXAMPLES`, the
default, or the first value a choice allows.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `mkdocs serve` from a shell whose venv does not hold the project
    sys.path.insert(0, str(REPO_ROOT))

PAGE = "spec-reference.md"
EXAMPLE_CHARS = 80  # a longer example would widen its table past reading
log = logging.getLogger("mkdocs.hooks.spec_reference")


@dataclass
class Row:
    """One field of the reference."""

    path: str
    type: str
    default: str
    description: str
    example: str


@dataclass
class Section:
    """The fields of one model, at the place it takes in a spec."""

    anchor: str
    title: str
    intro: str
    rows: list[Row] = field(default_factory=list)


class SchemaWalk:
    """Turns one JSON Schema into sections, following every nested model to its fields."""

    def __init__(self, document: dict[str, Any], examples: dict[str, Any], anchor_prefix: str = ""):
        self.definitions = document.get("$defs", {})
        self.examples = examples
        self.anchor_prefix = anchor_prefix
        self.sections: list[Section] = []
        self.undescribed: list[str] = []

    def model(self, schema: dict[str, Any], path: str, title: str, intro: str,
              enclosing: tuple[int, ...] = ()) -> None:
        """Add the section of ``schema`` (an object with properties) and of every model nested in it."""
        if id(schema) in enclosing:  # a model that holds itself is described once, where it first appears
            return
        section = Section(self.anchor(path), title, intro)
        self.sections.append(section)
        required = set(schema.get("required", ()))
        nested: list[tuple[str, dict[str, Any]]] = []
        for name, prop in schema.get("properties", {}).items():
            dotted = f"{path}.{name}" if path else name
            description = " ".join((prop.get("description") or "").split())
            if not description:
                self.undescribed.append(dotted)
            models = self.models_in(prop, dotted)
            example = self.example_of(prop, dotted)
            if models and (not example or len(example) > EXAMPLE_CHARS):
                # A nested model's own section has an example of each of its fields.
                example = ", ".join(f"[`{inner}`](#{self.anchor(inner)})" for inner, _ in models)
            section.rows.append(Row(dotted, self.type_of(prop), self.default_of(prop, name in required),
                                    description, example))
            nested += models
        for dotted, target in nested:
            self.model(target, dotted, f"`{dotted}`", target.get("description", ""), (*enclosing, id(schema)))

    def anchor(self, path: str) -> str:
        """The HTML id of the section at ``path``: unique on the page, stable across builds."""
        readable = path.replace("[]", "").replace(".*", ".each")
        return self.anchor_prefix + (re.sub(r"[^A-Za-z0-9_.]+", "-", readable).strip("-") or "spec")

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The schema a ``$ref`` points at, or ``schema`` itself."""
        reference = schema.get("$ref")
        return self.definitions[reference.rsplit("/", 1)[-1]] if reference else schema

    def models_in(self, prop: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
        """The models a property holds, each at its path: ``a`` itself, ``a[]`` in a list, ``a.*`` in a mapping."""
        found = []
        for member in prop.get("anyOf", prop.get("oneOf", [prop])):
            target = self.resolve(member)
            if "properties" in target:
                found.append((path, target))
            elif target.get("type") == "array" and isinstance(target.get("items"), dict):
                found += self.models_in(target["items"], f"{path}[]")
            elif target.get("type") == "object" and isinstance(target.get("additionalProperties"), dict):
                found += self.models_in(target["additionalProperties"], f"{path}.*")
            elif target.get("type") == "object" and isinstance(target.get("patternProperties"), dict):
                for value in target["patternProperties"].values():  # a mapping whose keys must match a pattern
                    found += self.models_in(value, f"{path}.*")
        return found

    def type_of(self, schema: dict[str, Any]) -> str:
        """A field's type in words: ``integer ≥ 1``, ``list of text``, ``mapping: text → number``."""
        members = schema.get("anyOf", schema.get("oneOf"))
        if members:
            words = [self.type_of(member) for member in members if member.get("type") != "null"]
            return " or ".join(dict.fromkeys(words)) or "null"
        if "$ref" in schema:
            target = self.resolve(schema)
            return "mapping (below)" if "properties" in target else self.type_of(target)
        if "enum" in schema:
            return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
        if "const" in schema:
            return f"`{schema['const']}`"
        kind = schema.get("type")
        if kind == "array":
            return f"list of {self.type_of(schema.get('items', {}))}"
        if kind == "object":
            values = schema.get("additionalProperties")
            if isinstance(values, dict):
                return f"mapping: text → {self.type_of(values)}"
            return "mapping (below)" if "properties" in schema else "mapping"
        words = {"string": "text", "integer": "integer", "number": "number", "boolean": "boolean"}.get(kind, "any")
        bounds = [f"{sign} {schema[key]:g}" for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"),
                                                              ("maximum", "≤"), ("exclusiveMaximum", "<"))
                  if key in schema]
        if "pattern" in schema:
            bounds.append(f"matching `{schema['pattern']}`")
        return " ".join([words, ", ".join(bounds)]).strip()

    @staticmethod
    def default_of(schema: dict[str, Any], required: bool) -> str:
        """``required``, ``none``, or the default as YAML."""
        if required:
            return "required"
        if "default" not in schema:
            return "see description"
        return "none" if schema["default"] is None else f"`{as_yaml(schema['default'])}`"

    def example_of(self, schema: dict[str, Any], path: str) -> str:
        """The field's example, from its model, the example specs or its default; empty when none has one."""
        if schema.get("examples"):
            return f"`{as_yaml(schema['examples'][0])}`"
        if path in self.examples:
            return f"`{as_yaml(self.examples[path])}`"
        default = schema.get("default")
        if default not in (None, [], {}, ""):
            return f"`{as_yaml(default)}`"
        for member in [schema, *schema.get("anyOf", []), schema.get("items", {})]:
            if member.get("enum"):
                return f"`{as_yaml(member['enum'][:1] if member is schema.get('items') else member['enum'][0])}`"
        return ""


def as_yaml(value: Any) -> str:
    """A value as one line of YAML, as it would be written in a spec."""
    if isinstance(value, str):
        text = yaml.safe_dump(value, default_style=None).strip()
        return text.removesuffix("\n...").removesuffix("...").strip()
    return json.dumps(value) if isinstance(value, (dict, list)) else yaml.safe_dump(value).split("\n")[0]


def spec_values(document: Any, path: str = "") -> dict[str, Any]:
    """Every value of a spec file by dotted path, list items under ``[]``, mapping entries also under ``*``."""
    values: dict[str, Any] = {path: document} if path else {}
    if isinstance(document, dict):
        for key, value in document.items():
            values.update(spec_values(value, f"{path}.{key}" if path else str(key)))
            if path:  # the same value, as any entry of a mapping field: sweep.parameters.*.choice
                for inner, found in spec_values(value, f"{path}.*").items():
                    values.setdefault(inner, found)
    elif isinstance(document, list):
        for item in document:
            for inner, found in spec_values(item, f"{path}[]").items():
                values.setdefault(inner, found)
    return values


# A commented-out field in an example spec (`# start_timeout_s: 600   # why`) is an example too.
COMMENTED_FIELD = re.compile(r"^(?P<indent>\s*)(?P<mark>#\s?)?(?P<pad>\s*)(?P<key>[a-z_][a-z0-9_]*):(?P<rest>\s.*)?$")


def commented_values(text: str) -> dict[str, Any]:
    """The values of the commented-out fields of a spec file, by dotted path (nesting read from indentation)."""
    values: dict[str, Any] = {}
    parents: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = COMMENTED_FIELD.match(line)
        if not match:
            continue
        indent = len(match["indent"]) + len(match["pad"])
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = ".".join([key for _, key in parents] + [match["key"]])
        parents.append((indent, match["key"]))
        if match["mark"] and (match["rest"] or "").strip():
            try:
                value = yaml.safe_load(match["rest"])
            except yaml.YAMLError:
                continue
            if value not in (None, [], {}, "..."):
                values.setdefault(path, value)
    return values


# Fields no example spec or page shows; a path here that is no field fails the strict build, so none goes stale.
EXAMPLES: dict[str, Any] = {
    "entrypoint_resources": {"accelerator_type:A100": 1},
    "entrypoint_label_selector": {"ray.io/accelerator-type": "A100"},
    "record_path": "s3://team-bucket/rayjobs-runs",
    "retry_on": ["JOB_SUPERVISOR_ACTOR_DIED", "exit_code:75"],
    "secret_env_vars": ["WANDB_API_KEY"],
    "runtime_env.py_modules": ["../my_lib"],
    "runtime_env.py_executable": "uv run",
    "runtime_env.excludes": ["data/", "*.ckpt"],
    "runtime_env.conda": "environment.yml",
    "runtime_env.image_uri": "rayproject/ray:2.60.0-py311",
    "runtime_env.container": {"image": "rayproject/ray:2.60.0-py311"},
    "runtime_env.java_jars": ["s3://team-bucket/jars/udf.jar"],
    "runtime_env.worker_process_setup_hook": "my_lib.logging_setup.configure",
    "runtime_env.pip.packages": ["requests==2.32.3"],
    "runtime_env.pip.pip_version": "==24.0",
    "runtime_env.pip.pip_install_options": ["--no-cache-dir"],
    "runtime_env.uv.packages": ["requests==2.32.3"],
    "runtime_env.uv.uv_version": "==0.4.0",
    "runtime_env.uv.uv_pip_install_options": ["--no-cache"],
    "runtime_env.config.log_files": ["worker.log"],
    "sweep.seed": 7,
    "sweep.parameters.*.uniform": [0.0, 0.1],
    "sweep.parameters.*.loguniform": [0.0001, 0.01],
    "sweep.parameters.*.randint": [16, 128],
    "notify[].url": "ntfy://ntfy.sh/team-training",
    "workload.train.resources_per_worker": {"CPU": 2, "memory": 4294967296},
    "workload.train.zero_init_residual": True,
    "workload.data.max_per_split": 200,
}


def page_values() -> list[tuple[dict[str, Any], str]]:
    """The YAML blocks of the documentation's pages that are spec fragments, with their text."""
    blocks = []
    for page in sorted((REPO_ROOT / "docs").glob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL):
            try:
                document = yaml.safe_load(block)
            except yaml.YAMLError:
                continue
            if isinstance(document, dict):
                blocks.append((document, block))
    return blocks


def example_values() -> dict[str, dict[str, Any]]:
    """Example values by workload kind ('' for the spec's own fields), from the example specs and the pages.

    A value set in an example spec (the first by file name) beats one commented out there, which beats one
    in a page's YAML block, which beats :data:`EXAMPLES`.
    """
    sources: list[tuple[dict[str, Any], str]] = []
    for spec_file in sorted((REPO_ROOT / "specs").glob("*.yaml")):
        text = spec_file.read_text()
        sources.append((yaml.safe_load(text) or {}, text))
    sources += page_values()
    found: dict[str, dict[str, Any]] = {}
    for commented in (False, True):
        for document, text in sources:
            workload = document.get("workload")
            kind = str(workload.get("kind", "")) if isinstance(workload, dict) else ""
            values = commented_values(text) if commented else spec_values(document)
            for path, value in values.items():
                bucket = kind if path.startswith("workload.") else ""
                found.setdefault(bucket, {}).setdefault(path, value)
    for path, value in EXAMPLES.items():
        for bucket in {"", *found}:
            found.setdefault(bucket, {}).setdefault(path, value)
    return found


def reference() -> tuple[list[Section], list[str]]:
    """The reference's sections, and what is wrong with it: fields without a description, stale examples."""
    from jobs.workload_kinds import BUILTIN_WORKLOADS
    from runner.cli.specs import schema_document

    examples = example_values()
    spec = SchemaWalk(schema_document(), examples.get("", {}))
    spec.model(spec.resolve(schema_document()), "", "The spec", "A spec file: one YAML mapping with these keys. "
               "Relative paths resolve against the spec file's directory.")
    sections, undescribed = spec.sections, spec.undescribed
    for kind, target in BUILTIN_WORKLOADS.items():
        walk = SchemaWalk(schema_document(kind), examples.get(kind, {}), anchor_prefix=f"{kind}-")
        intro = (f"`workload.kind: {kind}`, checked by `{target}` (`rayjobs schema --workload {kind}`). "
                 + schema_document(kind).get("description", ""))
        walk.model(schema_document(kind), "workload", f"Workload `{kind}`", intro)
        for section in walk.sections[1:]:
            section.title += f" ({kind})"
        sections += walk.sections
        undescribed += walk.undescribed
    sections += pipeline_sections(undescribed)
    # The spec's `workload` is a plain mapping until its kind is known: its examples are the kinds' sections.
    for row in sections[0].rows:
        if row.path == "workload":
            row.example = ", ".join(f"[`{kind}`](#{kind}-workload)" for kind in BUILTIN_WORKLOADS)
    fields = {row.path for section in sections for row in section.rows}
    problems = [f"the field {path} has no description; give it Field(description=...)" for path in undescribed]
    problems += [f"EXAMPLES in docs/hooks/spec_reference.py names {path}, which is no field" for path in EXAMPLES
                 if path not in fields]
    return sections, problems


def pipeline_sections(undescribed: list[str]) -> list[Section]:
    """The pipeline file's fields (``jobs.pipeline.PipelineFile``), examples from the shipped pipeline; a field
    without a description is added to ``undescribed``."""
    from jobs.pipeline import PipelineFile

    shipped = sorted((REPO_ROOT / "specs" / "pipelines").glob("*.yaml"))
    examples: dict[str, Any] = {}
    for path in shipped:
        document = yaml.safe_load(path.read_text())
        if isinstance(document, dict) and "pipeline" in document:
            examples = spec_values(document)
            break
    schema = PipelineFile.model_json_schema()
    walk = SchemaWalk(schema, examples, anchor_prefix="pipeline-")
    walk.model(schema, "", "A pipeline file", "`rayjobs submit PIPELINE.yaml`: its jobs, each a spec file with its "
               "overrides and the jobs it runs after ([Pipelines and quotas](pipelines.md)). Paths resolve against "
               "the pipeline file's directory.")
    undescribed += walk.undescribed
    return walk.sections


def cell(text: str) -> str:
    """Text that stays inside one Markdown table cell and reads as written: `code` kept, `<x>`, `*`, `|` literal.

    A `|` inside a code span needs no escape: the tables extension does not split cells there.
    """
    pieces = text.replace("\n", " ").split("`")
    for index in range(0, len(pieces), 2):  # outside `code` spans
        pieces[index] = (pieces[index].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
                         .replace("|", "\\|"))
    return "`".join(pieces)


def render(sections: list[Section]) -> str:
    """The page: one table per model, in the order a spec nests them."""
    lines = ["# Spec reference", "",
             "Generated from the JSON Schema `rayjobs schema` prints, so it lists exactly what a spec may hold. "
             "How the fields work together is on [Writing a spec](specs.md).", ""]
    for section in sections:
        lines += [f"## {section.title} {{#{section.anchor}}}", ""]
        if section.intro:
            lines += [" ".join(section.intro.split()), ""]
        lines += ["| field | type | default | description | example |", "|---|---|---|---|---|"]
        lines += [f"| `{row.path}` | {cell(row.type)} | {cell(row.default)} | {cell(row.description)} | "
                  f"{cell(row.example)} |" for row in section.rows]
        lines.append("")
    return "\n".join(lines)


def on_files(files, config):
    """Add the generated spec reference to the site's files (MkDocs event)."""
    from mkdocs.structure.files import File

    sections, problems = reference()
    for problem in problems:
        log.warning("spec reference: %s", problem)
    files.append(File.generated(config, PAGE, content=render(sections)))
    return files
