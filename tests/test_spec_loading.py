"""Spec files: reading, strict validation and the messages a user sees."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from jobs.errors import SpecError
from jobs.loader import load_spec
from jobs.spec import parse_size
from rayjobs_agent.wire import WORKLOAD_ENV_VAR
from jobs.submission import DEFAULT_EXCLUDES, build_submission

MINIMAL = """\
name: demo
entrypoint: python -c "print(1)"
"""


def write_spec(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def spec_error(tmp_path: Path, text: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(SpecError) as caught:
        load_spec(write_spec(tmp_path, text), overrides)
    return str(caught.value)


def test_minimal_spec_loads_with_defaults(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL))
    assert loaded.spec.name == "demo"
    assert loaded.spec.max_retries == 0
    assert loaded.spec.runtime_env is None
    assert loaded.workload is None


def test_error_names_file_line_and_field(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "entrypoint_num_gpu: 1\n")
    assert message == f"{tmp_path / 'job.yaml'}:3: entrypoint_num_gpu: unknown field (did you mean 'entrypoint_num_gpus'?)"


def test_unknown_runtime_env_key_suggests_pip(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "runtime_env:\n  pypi: [requests]\n")
    assert "runtime_env.pypi: unknown field (did you mean 'pip'?)" in message
    assert ":4:" in message


def test_missing_required_fields(tmp_path):
    message = spec_error(tmp_path, "name: demo\n")
    assert "entrypoint: is required" in message


def test_blank_entrypoint(tmp_path):
    assert "entrypoint: must not be blank" in spec_error(tmp_path, "name: demo\nentrypoint: '   '\n")


@pytest.mark.parametrize("name", ["Demo", "demo_job", "-demo", "demo-", "d" * 64, "dé"])
def test_bad_names(tmp_path, name):
    message = spec_error(tmp_path, f"name: '{name}'\nentrypoint: x\n")
    assert "name:" in message and "lowercase letters, digits and '-'" in message


@pytest.mark.parametrize("value", [-1, ".nan", ".inf", "-.inf"])
def test_resources_must_be_finite_and_non_negative(tmp_path, value):
    message = spec_error(tmp_path, MINIMAL + f"entrypoint_num_cpus: {value}\n")
    assert "entrypoint_num_cpus" in message
    assert "finite" in message or "negative" in message


def test_custom_resources_checked_per_key(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "entrypoint_resources:\n  TPU: -2\n")
    assert "entrypoint_resources.TPU: must not be negative" in message


def test_memory_accepts_sizes(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL + "entrypoint_memory: 8GiB\n"))
    assert loaded.spec.entrypoint_memory == 8 * 1024**3


def test_memory_rejects_nonsense(tmp_path):
    assert "is not a size" in spec_error(tmp_path, MINIMAL + "entrypoint_memory: lots\n")


@pytest.mark.parametrize(("text", "expected"), [
    (1024, 1024), ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5Gi", int(1.5 * 2**30)), ("10 KiB", 10240),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_pip_with_conda_is_an_error(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "runtime_env:\n  pip: [numpy]\n  conda: env.yaml\n")
    assert "pip and conda cannot be used together" in message


def test_pip_dict_form_is_strict(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "runtime_env:\n  pip:\n    packages: [numpy]\n    pip_chek: true\n")
    assert "runtime_env.pip.pip_chek: unknown field (did you mean 'pip_check'?)" in message


def test_working_dir_must_exist(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "runtime_env:\n  working_dir: ./missing\n")
    assert "runtime_env.working_dir: './missing' does not exist" in message


def test_working_dir_relative_to_spec_file(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    specs = tmp_path / "project" / "specs"
    specs.mkdir()
    path = write_spec(specs, MINIMAL + "runtime_env:\n  working_dir: ..\n")
    monkeypatch.chdir(tmp_path)
    loaded = load_spec(path)
    assert loaded.spec.runtime_env.working_dir == str((tmp_path / "project").resolve())


def test_remote_working_dir_is_not_checked(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL + "runtime_env:\n  working_dir: s3://bucket/code.zip\n"))
    assert loaded.spec.runtime_env.working_dir == "s3://bucket/code.zip"


def test_py_modules_must_exist(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "runtime_env:\n  py_modules: [./nope]\n")
    assert "runtime_env.py_modules: './nope' does not exist" in message


def test_env_var_scalars_become_text(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL + "runtime_env:\n  env_vars:\n    A: 1\n    B: true\n    C: 0.5\n"))
    assert loaded.spec.runtime_env.env_vars == {"A": "1", "B": "true", "C": "0.5"}


def test_env_var_lists_are_refused(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "runtime_env:\n  env_vars:\n    A: [1]\n")
    assert "runtime_env.env_vars.A: environment variable values must be text, got a list" in message


def test_env_var_without_value_is_refused(tmp_path):
    assert "has no value" in spec_error(tmp_path, MINIMAL + "runtime_env:\n  env_vars:\n    A:\n")


def test_metadata_values_must_be_text(tmp_path):
    assert "metadata.team" in spec_error(tmp_path, MINIMAL + "metadata:\n  team: [a]\n")


def test_ray_client_address_is_refused_with_hint(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "address: ray://head:10001\n")
    assert "ray:// is the Ray Client port" in message


def test_timeout_must_be_positive(tmp_path):
    assert "timeout_s" in spec_error(tmp_path, MINIMAL + "timeout_s: 0\n")


def test_max_retries_validated_now(tmp_path):
    assert "max_retries" in spec_error(tmp_path, MINIMAL + "max_retries: -1\n")


def test_several_problems_reported_together_in_line_order(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "timeout_s: -5\nentrypoint_num_gpu: 1\n")
    lines = message.splitlines()
    assert len(lines) == 2
    assert ":3: timeout_s" in lines[0] and ":4: entrypoint_num_gpu" in lines[1]


# --- YAML safety -------------------------------------------------------------------------


def test_duplicate_keys_are_an_error(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "name: again\n")
    assert "duplicate key 'name' (first defined on line 1)" in message
    assert ":3:" in message


def test_python_tags_are_refused(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "metadata: !!python/object/apply:os.system ['true']\n")
    assert "tag '!!python/object/apply:os.system' is not allowed" in message


def test_alias_bomb_fails_fast(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for previous, current in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{current}: &{current} [" + ",".join([f"*{previous}"] * 9) + "]")
    message = spec_error(tmp_path, "\n".join(lines) + "\n")
    assert "expands to more than" in message


def test_empty_file(tmp_path):
    assert "the file is empty" in spec_error(tmp_path, "\n\n")


def test_non_mapping_document(tmp_path):
    assert "must be a mapping" in spec_error(tmp_path, "- name: demo\n")


def test_binary_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"name: demo\x00\x01\x02")
    with pytest.raises(SpecError, match="binary file"):
        load_spec(path)


def test_non_utf8_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes("name: démo\n".encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(path)


def test_huge_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL + "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(SpecError, match="limited to"):
        load_spec(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


def test_invalid_yaml_reports_line(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "metadata: {a: 1\n")
    assert "not valid YAML" in message


def test_merge_keys_work(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL + "x-defaults: &d {team: ml}\n".replace("x-defaults", "metadata")
                                  .replace("metadata: &d {team: ml}", "metadata:\n  <<: {team: ml}\n  owner: me")))
    assert loaded.spec.metadata == {"team": "ml", "owner": "me"}


# --- workload section ----------------------------------------------------------------------


def test_workload_typo_caught_before_submission(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "workload:\n  kind: vision\n  train:\n    epoch: 3\n")
    assert "workload.train.epoch: unknown field (did you mean 'epochs'?)" in message
    assert ":6:" in message


def test_workload_type_error(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "workload:\n  kind: hello\n  tasks: many\n")
    assert "workload.tasks: Input should be a valid integer" in message and "'many'" in message


def test_workload_kind_required(tmp_path):
    assert "workload.kind: is required" in spec_error(tmp_path, MINIMAL + "workload:\n  tasks: 3\n")


def test_unknown_workload_kind(tmp_path):
    assert "unknown workload kind 'nope'" in spec_error(tmp_path, MINIMAL + "workload:\n  kind: nope\n")


def test_workload_paths_resolve_against_spec_dir(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL + "workload:\n  kind: vision\n  storage_path: results\n"))
    assert loaded.workload.storage_path == (tmp_path / "results").resolve()


def test_custom_workload_model_by_import_path(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL + "workload:\n  kind: workloads.hello:HelloParams\n  tasks: 2\n"))
    assert loaded.workload.tasks == 2


def test_workload_and_top_level_errors_reported_together(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "timeout: 3\nworkload:\n  kind: hello\n  taks: 2\n")
    assert "timeout: unknown field (did you mean 'timeout_s'?)" in message
    assert "workload.taks: unknown field (did you mean 'tasks'?)" in message


# --- what gets submitted -------------------------------------------------------------------------


def test_submission_carries_workload_and_default_excludes(tmp_path):
    path = write_spec(tmp_path, MINIMAL + "runtime_env:\n  working_dir: .\n  excludes: [data/]\n"
                                          "workload:\n  kind: hello\n  tasks: 3\n")
    submission = build_submission(load_spec(path))
    env = submission["runtime_env"]["env_vars"]
    assert '"tasks": 3' in env[WORKLOAD_ENV_VAR]
    assert submission["runtime_env"]["excludes"][0] == "data/"
    assert set(DEFAULT_EXCLUDES) <= set(submission["runtime_env"]["excludes"])
    assert submission["metadata"]["rayjobs.name"] == "demo"


def test_spec_hash_changes_with_content(tmp_path):
    first = build_submission(load_spec(write_spec(tmp_path, MINIMAL)))
    second = build_submission(load_spec(write_spec(tmp_path, MINIMAL.replace("print(1)", "print(2)"))))
    assert first["metadata"]["rayjobs.spec_hash"] != second["metadata"]["rayjobs.spec_hash"]


def test_shipped_specs_are_valid():
    specs = sorted((Path(__file__).resolve().parents[1] / "specs").glob("*.yaml"))
    assert specs, "the project ships example specs"
    for path in specs:
        load_spec(path)


def test_retry_on_accepts_error_types_and_exit_codes(tmp_path):
    loaded = load_spec(write_spec(tmp_path, MINIMAL + "retry_on: [JOB_SUPERVISOR_ACTOR_DIED, 'exit_code:3']\n"))
    assert loaded.spec.retry_on == ["JOB_SUPERVISOR_ACTOR_DIED", "exit_code:3"]


def test_retry_on_typo_suggests_error_type(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "retry_on: [JOB_SUPERVISOR_ACTOR_DEAD]\n")
    assert "did you mean 'JOB_SUPERVISOR_ACTOR_DIED'" in message


def test_default_retry_on_leaves_user_exits_alone(tmp_path):
    assert "JOB_ENTRYPOINT_COMMAND_ERROR" not in load_spec(write_spec(tmp_path, MINIMAL)).spec.retry_on


def test_secret_env_vars_must_name_env_vars(tmp_path):
    message = spec_error(tmp_path, MINIMAL + "secret_env_vars: [NOPE]\n")
    assert "secret_env_vars names NOPE" in message


def test_booleans_are_not_resource_amounts(tmp_path):
    assert "entrypoint_num_cpus" in spec_error(tmp_path, MINIMAL + "entrypoint_num_cpus: true\n")
    assert load_spec(write_spec(tmp_path, MINIMAL + "entrypoint_num_cpus: 2\n")).spec.entrypoint_num_cpus == 2
