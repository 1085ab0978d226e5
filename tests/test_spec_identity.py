"""A spec's identity (its spec hash) is what it runs, not where it sits: two checkouts of one project agree."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from rayjobs_agent.wire import METADATA_SPEC_HASH, WORKLOAD_ENV_VAR
from jobs.loader import load_spec
from jobs.submission import build_submission, spec_hash

SPEC = """\
name: identity
entrypoint: python train.py --data ./data
runtime_env:
  working_dir: .
workload:
  kind: vision
  run_name: identity
  storage_path: runs
  data:
    source: synthetic
"""


def make_project(root: Path) -> Path:
    """A project folder as a CI checkout holds it: a spec, code, and what never ships (caches, .git)."""
    root.mkdir(parents=True)
    (root / "job.yaml").write_text(textwrap.dedent(SPEC))
    (root / "train.py").write_text("print('training')\n")
    (root / "lib").mkdir()
    (root / "lib" / "model.py").write_text("LAYERS = 3\n")
    return root


def submission_of(project: Path) -> dict:
    return build_submission(load_spec(project / "job.yaml"))


def hash_of(project: Path) -> str:
    return submission_of(project)["metadata"][METADATA_SPEC_HASH]


def test_two_checkouts_of_one_project_have_one_spec_hash(tmp_path):
    first = make_project(tmp_path / "ci-workspace-1" / "project")
    second = tmp_path / "ci-workspace-2" / "checkout"
    shutil.copytree(first, second)
    one, two = submission_of(first), submission_of(second)
    # The submissions really differ in where they point: the working_dir and the workload's run folder.
    assert one["runtime_env"]["working_dir"] != two["runtime_env"]["working_dir"]
    assert str(first) in one["runtime_env"]["env_vars"][WORKLOAD_ENV_VAR]
    assert one["metadata"][METADATA_SPEC_HASH] == two["metadata"][METADATA_SPEC_HASH]


def test_a_changed_file_gives_another_spec_hash(tmp_path):
    first = make_project(tmp_path / "a")
    second = tmp_path / "b"
    shutil.copytree(first, second)
    (second / "lib" / "model.py").write_text("LAYERS = 4\n")
    assert hash_of(first) != hash_of(second)


def test_a_new_file_gives_another_spec_hash(tmp_path):
    project = make_project(tmp_path / "a")
    before = hash_of(project)
    (project / "lib" / "extra.py").write_text("")
    assert hash_of(project) != before


def test_files_that_are_never_uploaded_leave_the_spec_hash_alone(tmp_path, capfd):
    project = make_project(tmp_path / "a")
    (project / ".gitignore").write_text("*.log\n")
    before = hash_of(project)
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0compiled")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "train.log").write_text("epoch 1\n")
    assert hash_of(project) == before
    assert capfd.readouterr().err == "", "hashing is no upload: Ray's packaging says nothing"


def test_a_changed_workload_parameter_gives_another_spec_hash(tmp_path):
    first = make_project(tmp_path / "a")
    second = tmp_path / "b"
    shutil.copytree(first, second)
    spec = second / "job.yaml"
    spec.write_text(spec.read_text().replace("storage_path: runs", "storage_path: other-runs"))
    assert hash_of(first) != hash_of(second)


def test_only_whole_folder_names_of_the_spec_folder_are_made_relative(tmp_path):
    submission = {"entrypoint": "run", "runtime_env": {"env_vars": {"A": f"{tmp_path}/x", "B": f"{tmp_path}b/x"}}}
    moved = {"entrypoint": "run", "runtime_env": {"env_vars": {"A": "/elsewhere/x", "B": f"{tmp_path}b/x"}}}
    assert spec_hash(submission, tmp_path) == spec_hash(moved, Path("/elsewhere"))
    sibling = {"entrypoint": "run", "runtime_env": {"env_vars": {"A": f"{tmp_path}/x", "B": "/elsewhere/b/x"}}}
    assert spec_hash(submission, tmp_path) != spec_hash(sibling, Path("/elsewhere"))


def test_a_missing_working_dir_still_has_a_hash(tmp_path):
    submission = {"entrypoint": "run", "runtime_env": {"working_dir": str(tmp_path / "gone")}}
    assert spec_hash(submission, tmp_path) == spec_hash(submission, tmp_path)


def test_two_folders_whose_names_and_contents_string_along_alike_have_two_hashes(tmp_path):
    one, two = make_project(tmp_path / "one"), make_project(tmp_path / "two")
    # Strung along as name, NUL, content: "x\0" + "ABy\0CD" and "x\0" + "AB" + "y\0" + "CD" read the same.
    (one / "x").write_bytes(b"ABy\0CD")
    (two / "x").write_bytes(b"AB")
    (two / "y").write_bytes(b"CD")
    assert hash_of(one) != hash_of(two)


def test_what_gitignore_lists_counts_when_ray_is_told_to_upload_it(tmp_path, monkeypatch):
    project = make_project(tmp_path / "a")
    (project / ".gitignore").write_text("*.log\n")
    (project / "train.log").write_text("epoch 1\n")
    before = hash_of(project)
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")  # Ray's upload then takes train.log too
    assert hash_of(project) != before
