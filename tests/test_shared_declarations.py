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
