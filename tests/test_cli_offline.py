"""The rayjobs command where no cluster is needed: validate, schema, dry-run, errors, exit codes."""

from __future__ import annotations

import pytest

import json

from runner.errors import ExitCode, exit_code_for_status
from tests.support.cli import run_rayjobs, write_spec


def test_exit_codes_are_distinct():
    codes = [code.value for code in ExitCode]
    assert len(codes) == len(set(codes))
    assert exit_code_for_status("SUCCEEDED") == 0
    assert exit_code_for_status("FAILED") == 1
    assert exit_code_for_status("STOPPED") == 3
    assert exit_code_for_status("RUNNING") == 0


def test_validate_reports_each_file(tmp_path):
    good = write_spec(tmp_path, "good", "entrypoint: echo\n")
    bad = write_spec(tmp_path, "bad", "entrypoint: echo\ntimeout_s: soon\n")
    result = run_rayjobs("validate", str(good), str(bad), home=tmp_path)
    assert result.returncode == 2
    assert f"{good}: ok (good)" in result.stdout
    assert f"{bad}:5: timeout_s: Input should be a valid number" in result.stderr


def test_validate_shipped_specs(tmp_path):
    result = run_rayjobs("validate", "specs/hello.yaml",
                         home=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.processes
def test_schema_is_json_schema(tmp_path):
    result = run_rayjobs("schema", home=tmp_path)
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert {"name", "entrypoint"} <= set(schema["required"])
    workload = json.loads(run_rayjobs("schema", "--workload", "vision", home=tmp_path).stdout)
    assert "train" in workload["properties"]


@pytest.mark.processes
def test_dry_run_masks_secrets_and_contacts_nothing(tmp_path):
    spec = write_spec(tmp_path, "dry", "entrypoint: echo\n  \n".replace("  \n", "") +
                      "address: http://127.0.0.1:9\n")
    spec.write_text(spec.read_text().replace("runtime_env:\n", "runtime_env:\n  env_vars:\n    API_TOKEN: hunter2\n"
                                                                "    PLAIN: visible\n"))
    result = run_rayjobs("submit", str(spec), "--dry-run", "--output", "json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    submission = json.loads(result.stdout)
    env_vars = submission["runtime_env"]["env_vars"]
    assert {name: env_vars[name] for name in ("API_TOKEN", "PLAIN")} == {"API_TOKEN": "***", "PLAIN": "visible"}
    # The job uploads code (write_spec gives it a working_dir), so the progress channel rides along: the
    # run record's keeper names its Ray Train callback on the cluster, once it knows the cluster's Ray.
    assert json.loads(env_vars["RAYJOBS_RECORD"])["progress"] is True and "RAY_TRAIN_CALLBACKS" not in env_vars
    assert submission["runtime_env"]["py_modules"][-1].endswith("rayjobs_agent")
    assert "hunter2" not in result.stdout + result.stderr


@pytest.mark.processes
def test_submit_without_cluster_says_how_to_start_one(tmp_path):
    spec = write_spec(tmp_path, "nowhere", "entrypoint: echo\n")
    result = run_rayjobs("submit", str(spec), home=tmp_path)
    assert result.returncode == 4
    assert "rayjobs cluster up" in result.stderr and "--local" in result.stderr


def test_bad_flag_value_is_bad_input(tmp_path):
    result = run_rayjobs("list", "--output", "yaml", "--address", "http://127.0.0.1:9", home=tmp_path)
    assert result.returncode == 2
    assert "--output must be 'text' or 'json'" in result.stderr


def test_wrong_scheme_is_bad_input(tmp_path):
    result = run_rayjobs("status", "x", "--address", "ray://127.0.0.1:10001", home=tmp_path)
    assert result.returncode == 2
    assert "Ray Client port" in result.stderr


@pytest.mark.processes
def test_unreachable_cluster_is_a_clear_error(tmp_path):
    result = run_rayjobs("status", "anything", "--address", "http://127.0.0.1:9", home=tmp_path)
    assert result.returncode == 4
    assert "cannot reach the Ray dashboard at http://127.0.0.1:9" in result.stderr
    assert "Traceback" not in result.stderr
