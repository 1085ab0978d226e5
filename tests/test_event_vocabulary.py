"""The progress events have one vocabulary: ``rayjobs_agent/vocabulary.py`` spells every kind, the job
writes by it and the client reads by it, and no other module spells a kind or the event marker of its own.

The scan reads the source with :mod:`ast` and looks where a kind would be spelled: the first argument of an
``emit``, a comparison with an event's kind, an event written as a dict, a set of kinds, the marker in a string.
Other uses of the same words (a metric called ``step``, a queue's name field) are not kinds and pass.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from rayjobs_agent.vocabulary import decode as parse_event
from runner.follow.progress import RunProgress, event_line
from tests.support.cli import REPO_ROOT
from rayjobs_agent import events, vocabulary
from rayjobs_agent.vocabulary import EVENT_FIELDS, EVENT_KINDS, EVENT_MARKER, KIND_FIELD, EventKind

SCANNED = ("rayjobs_agent", "jobs", "runner", "workloads")
VOCABULARY_MODULES = {REPO_ROOT / "rayjobs_agent" / name
                      for name in ("vocabulary.py", "record_layout.py")}


def _is_kind(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in EVENT_KINDS


def _holds_kind(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_kind(element) for element in node.elts)
    return _is_kind(node)


def _reads_kind(node: ast.AST) -> bool:
    """``event["event"]``, ``event.get("event")``, ``kind_of(event)`` or a variable named ``kind``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == KIND_FIELD
    if isinstance(node, ast.Call):
        function = node.func
        if isinstance(function, ast.Attribute) and function.attr == "get":
            return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == KIND_FIELD
        return isinstance(function, ast.Name) and function.id == "kind_of"
    return isinstance(node, ast.Name) and node.id == "kind"


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_kinds(source: str) -> list[tuple[int, str]]:
    """Where ``source`` spells an event kind or the event marker itself: ``(line, what)``."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
            if name == "emit" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                found.append((node.lineno, f"emit({node.args[0].value!r})"))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_reads_kind(operand) for operand in operands) and any(_holds_kind(o) for o in operands):
                found.append((node.lineno, "an event's kind compared with a literal"))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == KIND_FIELD and _is_kind(value):
                    found.append((node.lineno, f"an event of kind {value.value!r} written as a dict"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            if len(node.elts) >= 2 and all(_is_kind(element) for element in node.elts):
                found.append((node.lineno, f"a collection of kinds {[element.value for element in node.elts]}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if EVENT_MARKER in node.value:
                found.append((node.lineno, f"the marker spelled in {node.value!r}"))
    return found


def test_the_scan_finds_each_way_a_kind_was_spelled_before():
    old = '''
def f(event, line, kind):
    """A docstring may say rayjobs-event and name report."""
    emit("report", iteration=1)
    if event["event"] == "stage" or event.get("event") in ("restart", "train_end"):
        pass
    if kind == "trial":
        pass
    WAIT_OVER = frozenset({"attempt", "report", "step"})
    at = line.find('rayjobs-event {"event":"queue"')
    return {"event": "count", "done": 1}
'''
    lines = sorted({line for line, _ in spelled_kinds(old)})
    assert lines == [4, 5, 7, 9, 10, 11], spelled_kinds(old)


def test_words_that_are_kinds_elsewhere_are_not_flagged():
    fine = '''
def f(metrics, state, attempt, event):
    metrics.pop("step", None)
    if state["queue"] == "main" and attempt.get("attempt") == 1:
        pass
    emit(EventKind.REPORT, step=1)
    return kind_of(event) == EventKind.STAGE, f"{EVENT_MARKER} x", ("epoch", "step", "iteration")
'''
    assert spelled_kinds(fine) == []


def test_no_module_outside_the_vocabulary_spells_an_event_kind_or_the_marker():
    found = []
    for package in SCANNED:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if path in VOCABULARY_MODULES:
                continue
            for line, what in spelled_kinds(path.read_text(encoding="utf-8")):
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: {what}")
    assert found == [], "use rayjobs_agent/vocabulary.py:\n" + \
        "\n".join(found)


def test_every_kind_has_its_fields_and_is_named_in_the_docs():
    assert set(EVENT_FIELDS) == EVENT_KINDS
    page = (REPO_ROOT / "docs" / "run-record.md").read_text(encoding="utf-8")
    assert [kind for kind in sorted(EVENT_KINDS) if f"`{kind}`" not in page] == []


@pytest.mark.parametrize("kind", sorted(EVENT_KINDS))
def test_each_kind_the_job_writes_the_client_reads(kind, capsys):
    fields = {name: None for name in EVENT_FIELDS[kind].__annotations__}
    events.emit(kind, **fields)
    event = parse_event(f"(TrainController pid=3) {capsys.readouterr().out.strip()}")
    assert event is not None and event[KIND_FIELD] == kind and set(event) == {KIND_FIELD, "time", *fields}
    progress = RunProgress()
    progress.update(event)
    event_line(event, progress)  # every kind is shown, or left out, without failing
    assert progress.events == 1


def test_a_kind_the_client_does_not_know_is_counted_and_not_shown():
    event = parse_event(f"{EVENT_MARKER} " + json.dumps({KIND_FIELD: "from_a_newer_job", "time": 1.0, "x": 1}))
    progress = RunProgress()
    progress.update(event)
    assert progress.events == 1 and event_line(event, progress) is None


def test_the_vocabulary_modules_need_only_the_standard_library():
    for path in VOCABULARY_MODULES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {alias.name.partition(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").partition(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and not node.level}
        assert imported <= set(sys.stdlib_module_names) | {"__future__"}, f"{path.name}: {imported}"


def test_the_kinds_are_the_constants_of_event_kind():
    assert EVENT_KINDS == {value for name, value in vars(EventKind).items() if name.isupper()}
    assert Path(vocabulary.__file__).resolve() in VOCABULARY_MODULES
