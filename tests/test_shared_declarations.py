"""What two commands or two workloads share is declared once: ``submit``'s and ``rerun``'s options, and the
rule that a model's weights are a local path."""

from __future__ import annotations

from dataclasses import fields

import pytest
import typer.main

from runner.cli.app import app
from runner.cli.options import SubmitFlags


def _options_of(command_name: str) -> list[tuple[str, ...]]:
    command = typer.main.get_command(app).commands[command_name]
    return [tuple(parameter.opts) for parameter in command.params if parameter.param_type_name == "option"]


def test_submit_and_rerun_take_the_same_options_in_the_same_order():
    submit, rerun = _options_of("submit"), _options_of("rerun")
    assert [option for option in rerun if option not in (("--force",), ("--continue",))] == submit
    assert [option[0] for option in submit[-len(fields(SubmitFlags)):]] == [
        "--no-wait", "--dry-run", "--output", "--local", "--stop-on-interrupt", "--quiet", "--no-preflight",
        "--give-up-after", "--raw"]


@pytest.mark.parametrize(("model", "weights_at"), [
    ("workloads.vision.config:VisionParams", ("train", "weights")),
    ("workloads.hf_vit.config:HFViTParams", ("model", "weights")),
])
def test_each_workload_refuses_weights_at_a_uri_by_the_one_shared_rule(model, weights_at, tmp_path):
    import importlib

    module_name, class_name = model.split(":")
    params = getattr(importlib.import_module(module_name), class_name)
    section, field = weights_at
    base = {"data": {"path": str(tmp_path)}} if "hf_vit" in module_name else {}
    with pytest.raises(ValueError, match=r"'s3://bucket/w' is a URI \(s3://\), but this field takes a local path"):
        params.model_validate({**base, section: {field: "s3://bucket/w"}})
    assert getattr(getattr(params.model_validate({**base, section: {field: "none"}}), section), field) == "none"


def _string_constants(path):
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    # A docstring may name a variable; it does not define one.
    documented = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documented]


def test_each_name_of_the_wire_is_spelled_once():
    """Variables, metadata keys and commands the client and the job share: defined in rayjobs_agent/wire.py only."""
    from rayjobs_agent import wire
    from tests.support.cli import REPO_ROOT

    spelled = {value: name for name, value in vars(wire).items() if name.isupper() and isinstance(value, str)}
    elsewhere = [f"{path.relative_to(REPO_ROOT)}:{line}: {text!r} (wire.{spelled[text]})"
                 for package in ("rayjobs_agent", "jobs", "runner", "workloads")
                 for path in sorted((REPO_ROOT / package).rglob("*.py")) if path.name != "wire.py" or
                 path.parent.name != "rayjobs_agent"
                 for line, text in _string_constants(path) if text in spelled]
    assert elsewhere == []
