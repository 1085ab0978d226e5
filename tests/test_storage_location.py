"""The one parser and type of storage locations: what each spelling means, and the same answer on every side."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from jobs.paths import SpecStoragePath
from tests.support.cli import REPO_ROOT
from rayjobs_agent.storage_location import StorageLocation


def test_an_s3_uri_is_a_bucket_and_a_key_written_back_as_it_was_meant():
    location = StorageLocation.parse("s3://bucket/runs/one/")
    assert (location.kind, location.bucket, location.key) == ("s3", "bucket", "runs/one")
    assert str(location) == "s3://bucket/runs/one" and location.fs_path == "bucket/runs/one"
    assert StorageLocation.parse(str(location)) == location
    assert StorageLocation.parse("S3://bucket//runs/one") == location


def test_a_bucket_alone_has_an_empty_key_and_is_its_own_parent():
    bucket = StorageLocation.parse("s3://bucket")
    assert (bucket.key, bucket.name, str(bucket)) == ("", "", "s3://bucket")
    assert bucket.parent == bucket


def test_joining_adds_keys_however_the_slashes_fall():
    bucket = StorageLocation.parse("s3://bucket/")
    joined = bucket / "runs/" / "/one" / "run.json"
    assert str(joined) == "s3://bucket/runs/one/run.json"
    assert joined == bucket.joinpath("runs", "one/run.json")
    assert (joined.name, str(joined.parent)) == ("run.json", "s3://bucket/runs/one")


def test_local_paths_relative_absolute_and_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    home = StorageLocation.parse("~/runs")
    assert (home.kind, home.path, str(home)) == ("local", str(tmp_path / "runs"), str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    relative = StorageLocation.parse("records/one")
    assert (relative.path, relative.absolute().path) == ("records/one", str(tmp_path / "records" / "one"))
    assert str(StorageLocation.parse("/data/runs") / "one") == "/data/runs/one"
    assert StorageLocation.parse(Path("/data/runs")).path == "/data/runs"
    assert os.fspath(StorageLocation.parse("/data/runs")) == "/data/runs"


def test_a_file_uri_is_a_local_path_on_this_machine_only():
    assert StorageLocation.parse("file:///data/two%20words").path == "/data/two words"
    assert StorageLocation.parse("file://localhost/data").path == "/data"
    with pytest.raises(ValueError, match="names the host 'elsewhere'"):
        StorageLocation.parse("file://elsewhere/data")


@pytest.mark.parametrize("text, says", [
    ("s3:/bucket/runs", "'s3:/bucket/runs' looks like an s3:// URI with slashes missing"),
    ("s3:bucket", "slashes missing"),
    ("s3://", r"'s3://' is not s3://BUCKET\[/PREFIX\]"),
    ("s3:///runs", "is not s3://BUCKET"),
    ("s3://Bad_Bucket/runs", "a bucket name is 3-63 lowercase letters"),
    ("gs://bucket/runs", r"gs:// is not supported; give s3://BUCKET/PREFIX or a local path"),
])
def test_a_malformed_location_is_refused_in_one_sentence_that_quotes_it(text, says):
    with pytest.raises(ValueError, match=says):
        StorageLocation.parse(text)


def test_only_object_storage_will_do_where_it_is_asked_for():
    assert StorageLocation.parse_s3("s3://bucket/code").is_s3
    for text in ("/data/code", "file:///data/code", "s3:/bucket"):
        with pytest.raises(ValueError, match="is not s3://BUCKET"):
            StorageLocation.parse_s3(text)


def test_an_object_location_is_no_local_path():
    with pytest.raises(TypeError, match="object storage"):
        os.fspath(StorageLocation.parse("s3://bucket/runs"))


def test_the_spec_the_workloads_and_the_run_commands_read_a_location_alike(tmp_path):
    from pydantic import TypeAdapter

    from runner.errors import BadInput
    from runner.records.store import Folder
    from workloads.storage import ObjectPath, storage_path

    spec_field = TypeAdapter(SpecStoragePath)
    assert spec_field.validate_python("s3://bucket/runs/") == "s3://bucket/runs"
    assert storage_path("s3://bucket/runs/") == ObjectPath("s3://bucket/runs") == StorageLocation("s3://bucket/runs")
    assert Folder("s3://bucket/runs/").location == "s3://bucket/runs"
    assert spec_field.validate_python(f"file://{tmp_path}/runs") == tmp_path / "runs"
    assert storage_path(f"file://{tmp_path}/runs") == tmp_path / "runs"
    assert Folder(f"file://{tmp_path}/runs").location == str(tmp_path / "runs")
    with pytest.raises(ValueError, match="slashes missing"):
        spec_field.validate_python("s3:/bucket/runs")
    with pytest.raises(ValueError, match="slashes missing"):
        storage_path("s3:/bucket/runs")
    with pytest.raises(BadInput, match="slashes missing"):
        Folder("s3:/bucket/runs")


def test_local_reads_and_writes_replace_files_whole(tmp_path):
    folder = StorageLocation.parse(str(tmp_path / "run"))
    assert folder.read("run.json") is None and folder.subfolders() == [] and folder.files() == []
    folder.write("logs/a/00001.log", b"one")
    folder.write("logs/a/00001.log", b"two")
    folder.write("run.json", b"{}")
    assert folder.read("logs/a/00001.log") == b"two" and folder.read("run.json/x") is None
    assert (folder.subfolders(), folder.files(), folder.files("logs/a")) == (["logs"], ["run.json"], ["00001.log"])
    assert sorted(path.name for path in (tmp_path / "run").rglob("*")) == ["00001.log", "a", "logs", "run.json"]


def test_the_keeper_and_the_client_write_and_read_one_s3_folder(aws_env, s3_endpoint):
    from runner.records.store import Folder
    from tests.support.s3_server import create_bucket
    from rayjobs_agent.record_store import Store

    create_bucket(s3_endpoint, "seam")
    store = Store.at("s3://seam/runs/one/")
    store.write("run-record/logs/a/00001.log", b"line\n")
    store.write("run.json", b"{}")
    folder = Folder("s3://seam/runs")
    assert folder.subfolders() == ["one"] and folder.child("one").read("run.json") == b"{}"
    assert folder.child("one").files("run-record/logs/a") == ["00001.log"] and store.read("missing") is None


def _tells_s3_apart(node: ast.AST) -> bool:
    """``x.startswith("s3://")``, ``x.removeprefix("s3://")`` or ``scheme == "s3"``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("startswith", "removeprefix"):
        return any(isinstance(constant, ast.Constant) and "s3://" in str(constant.value)
                   for argument in node.args for constant in ast.walk(argument))
    if isinstance(node, ast.Compare):
        return any(isinstance(side, ast.Constant) and side.value == "s3" for side in [node.left, *node.comparators])
    return False


def test_no_module_but_the_parser_tells_s3_apart_by_its_spelling():
    parser = REPO_ROOT / "rayjobs_agent" / "storage_location.py"
    found = [f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
             for package in ("jobs", "runner", "workloads") for path in sorted((REPO_ROOT / package).rglob("*.py"))
             if path != parser for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if _tells_s3_apart(node)]
    assert not found, f"these ask for s3:// themselves instead of StorageLocation: {found}"


def test_the_record_keepers_side_imports_neither_pyarrow_nor_jobs_until_s3_is_used():
    """The keeper is shipped alone (as ``rayjobs_agent``) and runs before the entrypoint: it must stay light."""
    import subprocess
    import sys

    probe = ("import sys; import rayjobs_agent.record_store as store; store.Store.at('~/runs'); "
             "print(sorted(m for m in ('pyarrow', 'jobs', 'workloads') if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT / "workloads", capture_output=True,
                           text=True, check=True)
    assert shown.stdout.strip() == "[]", shown.stderr


def test_the_record_keeper_starts_a_job_without_importing_ray():
    """The keeper wraps every job: Ray (seconds to import) is loaded only by what needs it, a queue or Train."""
    import subprocess
    import sys

    probe = "import sys; import rayjobs_agent.supervisor; print('ray' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT / "workloads", capture_output=True,
                           text=True, check=True)
    assert shown.stdout.strip() == "False", shown.stderr
