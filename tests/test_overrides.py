"""``--set`` overrides: parsing, applying, and their place in the precedence."""

from __future__ import annotations

import pytest

from jobs.errors import SpecError
from jobs.loader import load_spec
from jobs.overrides import apply_overrides, parse_override

SPEC = "name: demo\nentrypoint: run\nworkload:\n  kind: hello\n  tasks: 4\n"


def test_parse_values_as_yaml():
    assert parse_override("a.b=3") == (("a", "b"), 3)
    assert parse_override("a=[train, infer]") == (("a",), ["train", "infer"])
    assert parse_override("a=true") == (("a",), True)
    assert parse_override("a='3'") == (("a",), "3")
    assert parse_override("a=x=y") == (("a",), "x=y")
    assert parse_override("a.0=x") == (("a", 0), "x")


@pytest.mark.parametrize("text", ["noequals", "=3", "a..b=3", ".a=1"])
def test_malformed_overrides(text):
    with pytest.raises(SpecError):
        parse_override(text)


def test_set_creates_missing_mappings():
    data = {"name": "x"}
    apply_overrides(data, ["workload.train.epochs=3"])
    assert data["workload"] == {"train": {"epochs": 3}}


def test_set_indexes_lists():
    data = {"l": [1, 2]}
    apply_overrides(data, ["l.1=5", "l.2=6"])
    assert data["l"] == [1, 5, 6]


def test_set_into_scalar_is_an_error():
    with pytest.raises(SpecError, match="is a single value"):
        apply_overrides({"name": "x"}, ["name.first=y"])


def test_set_beats_the_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    assert load_spec(path, ["workload.tasks=9"]).workload.tasks == 9


def test_set_errors_name_the_flag(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    with pytest.raises(SpecError) as caught:
        load_spec(path, ["workload.tasks=lots"])
    assert "workload.tasks (from --set workload.tasks=lots)" in str(caught.value)


def test_set_validates_unknown_fields(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    with pytest.raises(SpecError, match="did you mean 'tasks'"):
        load_spec(path, ["workload.task=3"])
