"""`rayjobs export kuberay`: manifests checked against KubeRay's own CRD and operator rules, uploads to a real S3 server."""

from __future__ import annotations

import io
import os
import json
import re
import shlex
import socket
import textwrap
import zipfile
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from rayjobs_agent.wire import WORKLOAD_ENV_VAR
from jobs.loader import load_spec
from jobs.submission import build_submission
from runner.cli.app import app
from jobs.workload_contract import Demand
from runner.export.kuberay import WorkerGroup, size_worker_group
from tests.support.cli import REPO_ROOT, run_rayjobs
from tests.support.kuberay import (KUBERAY_SAMPLES, RAYJOB_CRD, assert_operator_rules, assert_valid_rayjob,
                                   closed_schema, export, schema_errors)
from tests.support.s3_server import create_bucket
from tests.support.s3_server import s3_client as _s3_client
from tests.support.waiting import HANG_GUARD_S

REMOTE_WORKING_DIR = "runtime_env.working_dir=s3://bucket/_ray_pkg_0123456789abcdef.zip"


@pytest.fixture(scope="session")
def rayjob_schema() -> jsonschema.protocols.Validator:
    """The v1 RayJob schema of KubeRay's CRD, with unknown fields made errors (as kubeconform does)."""
    return closed_schema(RAYJOB_CRD)


def runtime_env_of(manifest: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])


def worker_group(manifest: dict[str, Any]) -> dict[str, Any]:
    (group,) = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


def container(group: dict[str, Any]) -> dict[str, Any]:
    (only,) = group["template"]["spec"]["containers"]
    return only


def test_food101_gets_a_cluster_sized_from_its_workload(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR)
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == "food101-lite"
    assert spec["entrypoint"] == "python -m workloads.vision"
    assert spec["activeDeadlineSeconds"] == 21600
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert "backoffLimit" not in spec and "clusterSelector" not in spec

    assert "warning: the job runs without rayjobs' agent, which only --upload-to can ship" in stderr
    submission = build_submission(load_spec(REPO_ROOT / "specs/food101.yaml", [REMOTE_WORKING_DIR]),
                                  beside_agent=False)
    runtime_env = runtime_env_of(manifest)
    assert runtime_env == submission["runtime_env"]
    assert json.loads(runtime_env["env_vars"][WORKLOAD_ENV_VAR])["train"]["num_workers"] == 4
    assert spec["metadata"] == submission["metadata"]
    assert spec["metadata"]["dataset"] == "food101-lite"

    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == "2.60.0"
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # training and inference land on the workers
    group = worker_group(manifest)
    # 4 training workers of 4 CPUs; the 2 inference actors of 2 CPUs fit on them afterwards.
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 4
    limits = container(group)["resources"]["limits"]
    assert limits == {"cpu": "4", "memory": "16Gi"}
    assert container(group)["resources"]["requests"] == limits
    images = {container(group)["image"], container(head)["image"]}
    assert images == {"rayproject/ray:2.60.0-py311"}
    assert "4 pods of 4 CPU" in stderr


def test_existing_cluster_is_selected_and_backoff_limit_dropped_with_a_warning(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, "--set", "max_retries=2",
                                    "--cluster", "shared-ray")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    spec = manifest["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": "shared-ray"}
    assert "rayClusterSpec" not in spec and "backoffLimit" not in spec
    # The operator never deletes a selected cluster; saying so would mislead.
    assert "shutdownAfterJobFinishes" not in spec and "ttlSecondsAfterFinished" not in spec
    assert "warning: max_retries (2) is dropped" in stderr


def test_own_cluster_keeps_retries_as_backoff_limit(rayjob_schema):
    code, manifest, stderr = export("specs/hello.yaml", "--set", REMOTE_WORKING_DIR, "--set", "max_retries=3")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    assert manifest["spec"]["backoffLimit"] == 3
    assert "warning: retry_on" in stderr  # KubeRay retries after any failure, not only the listed ones


def test_gpu_training_asks_for_gpus_and_a_gpu_image(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR,
                                    "--set", "workload.train.use_gpu=true")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    group = worker_group(manifest)
    assert group["replicas"] == 4
    assert container(group)["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    assert container(group)["image"] == "rayproject/ray:2.60.0-py311-gpu"


def test_image_flag_replaces_the_default_image(rayjob_schema):
    code, manifest, stderr = export("specs/vit-hf.yaml", "--set", REMOTE_WORKING_DIR, "--set",
                                    "workload.data.path=/tmp", "--set", "workload.train.num_workers=2",
                                    "--set", "workload.train.cpus_per_worker=1", "--image", "registry.example/rayjobs:1")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    group = worker_group(manifest)
    assert group["replicas"] == 2 and container(group)["resources"]["limits"]["cpu"] == "1"
    assert container(group)["image"] == "registry.example/rayjobs:1"


def test_hello_gets_a_small_worker_group_and_a_note(rayjob_schema):
    code, manifest, stderr = export("specs/hello.yaml", "--set", REMOTE_WORKING_DIR)
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    group = worker_group(manifest)
    assert group["replicas"] == 1
    assert container(group)["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
    assert "note: workload 'hello' does not say how many workers it needs" in stderr


@pytest.mark.parametrize(("max_concurrent", "replicas", "note"), [
    ("3", 6, None), ("auto", 8, "the sweep's max_concurrent is auto: the worker group is sized for 4 trial(s)")])
def test_a_sweep_gets_workers_for_the_trials_it_runs_at_once(tmp_path, rayjob_schema, max_concurrent, replicas, note):
    spec = tmp_path / "swept.yaml"
    spec.write_text("name: swept\nentrypoint: python -m workloads.vision\n"
                    "runtime_env:\n  working_dir: s3://bucket/_ray_pkg_0123456789abcdef.zip\n"
                    "workload:\n  kind: vision\n  stages: [train]\n  train: {num_workers: 2, cpus_per_worker: 1}\n"
                    f"sweep:\n  metric: val_loss\n  mode: min\n  samples: 4\n  max_concurrent: {max_concurrent}\n"
                    "  parameters:\n    workload.train.lr: {loguniform: [1.0e-4, 1.0e-2]}\n")
    code, manifest, stderr = export(str(spec))
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    group = worker_group(manifest)
    assert group["replicas"] == replicas and container(group)["resources"]["limits"]["cpu"] == "1"
    assert (note in stderr) if note else "max_concurrent is auto" not in stderr


def test_fields_without_a_rayjob_equivalent_are_named_in_warnings(tmp_path, rayjob_schema):
    spec = tmp_path / "unmapped.yaml"
    spec.write_text(
        "name: unmapped\nentrypoint: python -c pass\nruntime_env:\n  working_dir: s3://bucket/pkg.zip\n"
        "entrypoint_num_cpus: 1.5\nentrypoint_num_gpus: 0\nentrypoint_memory: 2GiB\n"
        "entrypoint_resources: {accel: 1}\nentrypoint_label_selector: {zone: a}\n"
        "address: http://head:8265\nsubmission_id: unmapped-1\nstart_timeout_s: 90.5\n"
        "workload:\n  kind: vision\n  stages: [preprocess]\n")
    code, manifest, stderr = export(str(spec))
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    job = manifest["spec"]
    assert job["jobId"] == "unmapped-1"
    assert job["entrypointNumCpus"] == 1.5 and job["entrypointNumGpus"] == 0
    assert json.loads(job["entrypointResources"]) == {"accel": 1}
    assert job["preRunningDeadlineSeconds"] == 91
    head = job["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "2"  # the driver's 1.5 CPUs must exist on the head
    (resources,) = shlex.split(head["rayStartParams"]["resources"])  # as the pod's shell reads it
    assert json.loads(resources) == {"accel": 1}
    warnings = [line for line in stderr.splitlines() if line.startswith("rayjobs: warning:")]
    for field_name in ("entrypoint_memory", "entrypoint_label_selector", "address"):
        assert any(field_name in line for line in warnings), (field_name, stderr)
    assert "note: workload 'vision' does not say how many workers it needs" in stderr  # no train stage


def test_custom_resources_of_training_workers_are_named_in_a_warning(tmp_path):
    spec = tmp_path / "custom.yaml"
    spec.write_text("name: custom\nentrypoint: python -m workloads.vision\nruntime_env:\n  working_dir: s3://b/p.zip\n"
                    "workload:\n  kind: vision\n  stages: [train]\n  train:\n    resources_per_worker: {accel: 1}\n")
    code, manifest, stderr = export(str(spec))
    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("rayjobs: warning:")]
    assert any("train.resources_per_worker" in line and '"accel": 1' in line for line in warnings), stderr


def test_secrets_are_placeholders_never_values(tmp_path):
    spec = tmp_path / "secrets.yaml"
    spec.write_text("name: secrets\nentrypoint: python -c pass\nruntime_env:\n  working_dir: s3://b/pkg.zip\n"
                    "  env_vars:\n    API_TOKEN: hunter2\n    DB_URL: postgres://u:swordfish@db\n"
                    "    PLAIN: visible\nsecret_env_vars: [DB_URL]\n")
    result = CliRunner().invoke(app, ["export", "kuberay", str(spec)])
    assert result.exit_code == 0, result.stderr
    assert "hunter2" not in result.output + result.stderr and "swordfish" not in result.output + result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert_operator_rules(manifest)
    env_vars = runtime_env_of(manifest)["env_vars"]
    assert env_vars == {"API_TOKEN": "${API_TOKEN}", "DB_URL": "${DB_URL}", "PLAIN": "visible"}
    assert "warning: secret environment variables API_TOKEN, DB_URL are written as placeholders" in result.stderr


def test_local_working_dir_is_an_error_naming_upload_to(tmp_path):
    result = run_rayjobs("export", "kuberay", "specs/hello.yaml", home=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "KubeRay cannot upload local files" in result.stderr and "--upload-to" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_spec_fails_as_validate_does(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nentrypoint: echo\ntimeout_s: soon\n")
    validate = CliRunner().invoke(app, ["validate", str(spec)])
    code, manifest, stderr = export(str(spec))
    assert code == validate.exit_code == 2
    assert manifest is None
    assert stderr == validate.stderr
    assert "timeout_s: Input should be a valid number" in stderr


def test_names_the_operator_refuses_are_bad_input():
    code, _, stderr = export("specs/hello.yaml", "--set", REMOTE_WORKING_DIR, "--set", "name=" + "a" * 48)
    assert code == 2 and "at most 47 characters" in stderr
    code, _, stderr = export("specs/hello.yaml", "--set", REMOTE_WORKING_DIR, "--set", "name=1hello")
    assert code == 2 and "starting with a letter" in stderr
    code, _, stderr = export("specs/hello.yaml", "--set", REMOTE_WORKING_DIR, "--cluster", "Not_A_Name")
    assert code == 2 and "is not a RayCluster name" in stderr
    code, _, stderr = export("specs/hello.yaml", "--upload-to", "https://bucket/prefix")
    assert code == 2 and "is not s3://BUCKET[/PREFIX]" in stderr


def test_worker_group_fits_the_hungriest_phase():
    assert size_worker_group([Demand("training", 4, 4, 0), Demand("inference", 2, 2, 0)]) == WorkerGroup(4, 4, 16, 0)
    # Inference wants more CPUs per bundle than training: pods grow to fit it, training packs two per pod.
    assert size_worker_group([Demand("training", 4, 1, 0), Demand("inference", 3, 2, 0)]) == WorkerGroup(3, 2, 8, 0)
    assert size_worker_group([Demand("training", 2, 1.5, 1), Demand("inference", 4, 1, 0)]) == WorkerGroup(2, 2, 8, 1)


# --- the validator itself: it must reject what the API server would, and accept KubeRay's own samples ---

Mutation = Callable[[Any, Any], None]


def _misspelled_as(typo: str) -> Mutation:
    def mutate(parent: dict[str, Any], key: str) -> None:
        parent[typo] = parent.pop(key)
    return mutate


def _set_to(value: Any) -> Mutation:
    def mutate(parent: dict[str, Any], key: str) -> None:
        parent[key] = value
    return mutate


def _removed(parent: dict[str, Any], key: str) -> None:
    del parent[key]


def _parent_and_key(manifest: dict[str, Any], dotted: str) -> tuple[Any, Any]:
    """The object holding the field at `a.b.0.c` (digits index lists), and the field's key in it."""
    *steps, last = [int(step) if step.isdigit() else step for step in dotted.split(".")]
    parent: Any = manifest
    for step in steps:
        parent = parent[step]
    return parent, last


WORKER = "spec.rayClusterSpec.workerGroupSpecs.0"
WORKER_CONTAINER = f"{WORKER}.template.spec.containers.0"


@pytest.fixture
def exported_manifest() -> dict[str, Any]:
    """A fresh export of specs/food101.yaml, which brings a cluster of its own."""
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR)
    assert code == 0, stderr
    return manifest


@pytest.mark.parametrize(("field", "mutate", "expected_error"), [
    pytest.param("spec.entrypoint", _misspelled_as("entrypont"),
                 "spec: Additional properties are not allowed ('entrypont' was unexpected)",
                 id="misspelled spec.entrypoint"),
    pytest.param("spec.rayClusterSpec.workerGroupSpecs", _misspelled_as("workerGroupSpec"),
                 "spec.rayClusterSpec: Additional properties are not allowed ('workerGroupSpec' was unexpected)",
                 id="misspelled rayClusterSpec.workerGroupSpecs"),
    # Deep inside the pod template: the closing must reach the Kubernetes types the CRD embeds.
    pytest.param(f"{WORKER_CONTAINER}.resources", _misspelled_as("resource"),
                 f"{WORKER_CONTAINER}: Additional properties are not allowed ('resource' was unexpected)",
                 id="misspelled container resources"),
    pytest.param("spec.ttlSecondsAfterFinished", _set_to("600"),
                 "spec.ttlSecondsAfterFinished: '600' is not of type 'integer'",
                 id="ttlSecondsAfterFinished as a string"),
    pytest.param(f"{WORKER}.replicas", _set_to("4"), f"{WORKER}.replicas: '4' is not of type 'integer'",
                 id="replicas as a string"),
    # `ray start` flags are strings in the CRD; a bare YAML number is a common slip.
    pytest.param("spec.rayClusterSpec.headGroupSpec.rayStartParams.num-cpus", _set_to(0),
                 "spec.rayClusterSpec.headGroupSpec.rayStartParams.num-cpus: 0 is not of type 'string'",
                 id="rayStartParams value as a number"),
    pytest.param(f"{WORKER_CONTAINER}.name", _removed, f"{WORKER_CONTAINER}: 'name' is a required property",
                 id="container without name"),
    pytest.param(f"{WORKER}.groupName", _removed, f"{WORKER}: 'groupName' is a required property",
                 id="worker group without groupName"),
    pytest.param("spec.rayClusterSpec.headGroupSpec.template", _removed,
                 "spec.rayClusterSpec.headGroupSpec: 'template' is a required property",
                 id="head group without template"),
])
def test_validator_rejects_an_export_with_one_field_broken_and_names_that_field(
        exported_manifest, rayjob_schema, field, mutate, expected_error):
    assert_valid_rayjob(exported_manifest, rayjob_schema)  # intact, the same manifest passes
    mutate(*_parent_and_key(exported_manifest, field))
    assert schema_errors(exported_manifest, rayjob_schema) == [expected_error]
    with pytest.raises(AssertionError, match=re.escape(expected_error)):
        assert_valid_rayjob(exported_manifest, rayjob_schema)


def test_kuberays_own_samples_pass_the_same_checks(rayjob_schema):
    # Were the closed schema or the operator rules stricter than KubeRay, its own samples would fail them.
    jobs = [(path.name, document) for path in sorted(KUBERAY_SAMPLES.glob("*.yaml"))
            for document in yaml.safe_load_all(path.read_text()) if document and document["kind"] == "RayJob"]
    assert len(jobs) >= 6, f"expected KubeRay's RayJob samples in {KUBERAY_SAMPLES}"
    failures = {}
    for name, job in jobs:
        try:
            assert_valid_rayjob(job, rayjob_schema)
        except AssertionError as error:
            failures[name] = str(error)
    assert not failures, failures


# --- --upload-to against a real S3 server (moto's, on loopback) ---

BUCKET = "rayjobs-packages"


@pytest.fixture
def aws_env(aws_env: dict[str, str], s3_endpoint: str) -> dict[str, str]:
    create_bucket(s3_endpoint, BUCKET)
    return aws_env


@pytest.fixture
def project_spec(tmp_path: Path) -> Path:
    """A spec whose working_dir holds files Ray would ship and files it would leave out."""
    project = tmp_path / "project"
    for relative, text in {
        "main.py": "print('hi')\n", "pkg/mod.py": "X = 1\n", ".gitignore": "ignored.txt\n",
        "ignored.txt": "by .gitignore\n", "data/big.bin": "by the spec's excludes\n",
        ".git/config": "by rayjobs and Ray\n", "__pycache__/main.cpython-311.pyc": "by both too\n",
    }.items():
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_text(text)
    spec = tmp_path / "upload.yaml"
    spec.write_text("name: upload-demo\nentrypoint: python main.py\nruntime_env:\n  working_dir: project\n"
                    "  excludes: [data/]\nworkload:\n  kind: hello\n")
    return spec


def test_upload_to_packages_as_ray_does_and_references_the_zip(project_spec, s3_endpoint, aws_env):
    code, manifest, stderr = export(str(project_spec), "--upload-to", f"s3://{BUCKET}/team/jobs")
    assert code == 0, stderr
    assert_operator_rules(manifest)
    runtime_env = runtime_env_of(manifest)
    uri = runtime_env["working_dir"]
    assert re.fullmatch(rf"s3://{BUCKET}/team/jobs/_ray_pkg_[0-9a-f]+\.zip", uri), uri
    assert "excludes" not in runtime_env  # applied when packaging
    assert f"uploaded working_dir {project_spec.parent / 'project'}" in stderr
    # The job keeps its own run record in the pod: KubeRay's cluster goes, so the export says where to keep it.
    assert manifest["spec"]["entrypoint"] == "python -m rayjobs_agent.supervisor -- 'python main.py'"
    (keeper,) = [module for module in runtime_env["py_modules"]
                 if re.fullmatch(rf"s3://{BUCKET}/team/jobs/_ray_pkg_[0-9a-f]+-module\.zip", module)]
    # Ray drops the single top folder of a remote zip: the package's own folder must sit one level down.
    keeper_zip = _s3_client(s3_endpoint).get_object(Bucket=BUCKET, Key=keeper.split(f"{BUCKET}/", 1)[1])["Body"].read()
    assert "module/rayjobs_agent/supervisor.py" in zipfile.ZipFile(io.BytesIO(keeper_zip)).namelist()
    assert "the run record goes to ~/rayjobs-results in the head pod" in stderr

    # The name is the one Ray's own upload path gives the same directory with the same excludes.
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    submission = build_submission(load_spec(project_spec))
    ray_env = upload_working_dir_if_needed(dict(submission["runtime_env"]), include_gitignore=True,
                                           upload_fn=lambda *args, **kwargs: None)
    assert uri.rsplit("/", 1)[1] == ray_env["working_dir"].split("://", 1)[1]

    body = _s3_client(s3_endpoint).get_object(Bucket=BUCKET, Key=uri.split(f"{BUCKET}/", 1)[1])["Body"].read()
    names = {name for name in zipfile.ZipFile(io.BytesIO(body)).namelist() if not name.endswith("/")}
    assert {"main.py", "pkg/mod.py"} <= names
    assert not names & {"ignored.txt", "data/big.bin", ".git/config", "__pycache__/main.cpython-311.pyc"}

    code, again, stderr = export(str(project_spec), "--upload-to", f"s3://{BUCKET}/team/jobs")
    assert code == 0 and runtime_env_of(again)["working_dir"] == uri
    assert "is already uploaded as" in stderr


def test_an_upload_cut_off_publishes_nothing_and_a_truncated_package_is_never_trusted(project_spec, s3_endpoint,
                                                                                       aws_env, monkeypatch, tmp_path):
    """Ctrl-C while the code is sent: the package's name must not appear until the whole zip is stored."""
    from rayjobs_agent.storage_location import StorageLocation
    from runner.export import packaging

    code, manifest, stderr = export(str(project_spec), "--upload-to", f"s3://{BUCKET}/cut")
    assert code == 0, stderr
    key = runtime_env_of(manifest)["working_dir"].split(f"{BUCKET}/", 1)[1]
    s3 = _s3_client(s3_endpoint)
    whole = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    # As an earlier version left it: an upload cut off half-way, completed by pyarrow's close under the name.
    s3.put_object(Bucket=BUCKET, Key=key, Body=whole[:len(whole) // 2])
    code, again, stderr = export(str(project_spec), "--upload-to", f"s3://{BUCKET}/cut")
    assert code == 0 and "uploaded working_dir" in stderr, stderr
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == whole

    # Ctrl-C while the zip is being sent: nothing under the package's name, nothing left half-way beside it.
    s3.delete_object(Bucket=BUCKET, Key=key)
    monkeypatch.setattr(packaging, "UPLOAD_CHUNK_BYTES", 64)
    real_filesystem = StorageLocation.filesystem

    class CutStream:
        """The upload stream, interrupted at its second chunk: pyarrow's close still completes what was written."""

        def __init__(self, stream):
            self.stream, self.chunks = stream, 0

        def write(self, data):
            self.chunks += 1
            if self.chunks == 2:
                raise KeyboardInterrupt
            return self.stream.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.stream.close()

    class CutFilesystem:
        def __init__(self, filesystem):
            self.filesystem = filesystem

        def open_output_stream(self, path, *args, **kwargs):
            return CutStream(self.filesystem.open_output_stream(path, *args, **kwargs))

        def __getattr__(self, name):
            return getattr(self.filesystem, name)

    monkeypatch.setattr(StorageLocation, "filesystem", lambda self, settings: CutFilesystem(real_filesystem(self,
                                                                                                            settings)))
    with pytest.raises(KeyboardInterrupt):
        packaging.upload_local_paths({"working_dir": str(project_spec.parent / "project"), "excludes": ["data/"]},
                                     f"s3://{BUCKET}/cut", env=dict(os.environ))
    left = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="cut/").get("Contents", [])]
    assert key not in left and not [name for name in left if ".partial-" in name], left


def test_upload_to_a_missing_bucket_is_bad_input(project_spec, aws_env):
    code, manifest, stderr = export(str(project_spec), "--upload-to", "s3://no-such-bucket/x")
    assert code == 2 and manifest is None
    assert "bucket 'no-such-bucket' does not exist at http://127.0.0.1:" in stderr
    assert "Traceback" not in stderr


def test_upload_with_refused_credentials_exits_7(project_spec, aws_env, monkeypatch):
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks keys from now on
    code, _, stderr = export(str(project_spec), "--upload-to", f"s3://{BUCKET}/x")
    assert code == 7, stderr
    assert "refused access" in stderr and "AWS_ACCESS_KEY_ID" in stderr
    assert "testing" not in stderr


@pytest.mark.timeout(HANG_GUARD_S)
def test_upload_to_an_unreachable_endpoint_fails_without_hanging(project_spec, aws_env, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port}")
    code, _, stderr = export(str(project_spec), "--upload-to", f"s3://{BUCKET}/x")
    assert code == 4, stderr
    assert f"cannot reach the object store at http://127.0.0.1:{closed_port}" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_a_queued_spec_joins_its_kueue_local_queue_with_its_priority_class(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, "--set", "queue=team-a",
                                    "--priority-class", "nightly")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    assert manifest["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a",
                                              "kueue.x-k8s.io/priority-class": "nightly"}
    assert "LocalQueue team-a" in stderr
    # Created suspended, it cannot start outside the quota; Kueue wants the cluster gone when the job ends.
    assert manifest["spec"]["suspend"] is True and manifest["spec"]["shutdownAfterJobFinishes"] is True
    assert "managedBy" not in manifest["spec"]


def test_a_numeric_priority_without_a_priority_class_is_named_not_dropped_silently(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, "--set", "queue=team-a",
                                    "--set", "priority=5")
    assert code == 0, stderr
    assert manifest["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert "priority 5 is not exported" in stderr


@pytest.mark.parametrize("args, message", [
    (["--priority-class", "nightly"], "--priority-class needs a queued spec"),
    (["--set", "queue=team-a", "--priority-class", "Not_A_Name"], "is not a Kubernetes object name"),
])
def test_a_priority_class_is_refused_where_kueue_could_not_use_it(args, message):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, *args)
    assert code == 2 and manifest is None
    assert message in stderr


def test_a_resource_name_a_shell_would_read_is_refused_and_names_reach_the_shell_quoted(tmp_path):
    spec = tmp_path / "resources.yaml"
    spec.write_text("name: resources\nentrypoint: python -c pass\nruntime_env:\n  working_dir: s3://bucket/pkg.zip\n"
                    "entrypoint_resources: {'x\"$(touch FILE)': 1}\n")
    code, _, stderr = export(str(spec))
    assert code == 2 and "entrypoint_resources" in stderr, stderr
    spec.write_text(spec.read_text().replace("'x\"$(touch FILE)'", "'accelerator_type:A100'"))
    code, manifest, stderr = export(str(spec))
    assert code == 0, stderr
    quoted = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["resources"]
    assert shlex.split(f"ray start --resources={quoted}")[-1] == '--resources={"accelerator_type:A100": 1.0}'


def test_an_unqueued_spec_is_neither_suspended_nor_handed_to_a_manager(exported_manifest):
    assert "suspend" not in exported_manifest["spec"] and "managedBy" not in exported_manifest["spec"]


def test_a_queued_spec_on_an_existing_cluster_is_not_suspended_and_the_queue_it_skips_is_named(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, "--set", "queue=team-a",
                                    "--cluster", "shared")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    assert "suspend" not in manifest["spec"]
    assert "Kueue does not queue a RayJob that runs on an existing cluster" in stderr


def test_multikueue_hands_a_queued_rayjob_to_the_manager_cluster_suspended(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, "--set", "queue=team-a",
                                    "--multikueue")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    assert manifest["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert manifest["spec"]["suspend"] is True
    assert "MultiKueue admission check" in stderr


@pytest.mark.parametrize("args, message", [
    pytest.param([], "--multikueue needs a queued spec", id="no queue"),
    pytest.param(["--set", "queue=team-a", "--cluster", "shared"], "--multikueue cannot go with --cluster",
                 id="existing cluster"),
    pytest.param(["--set", "queue=team-a", "--schedule", "0 3 * * *"], "--multikueue cannot go with --schedule",
                 id="scheduled"),
])
def test_multikueue_is_refused_where_nothing_would_ever_run_the_rayjob(args, message):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, "--multikueue", *args)
    assert code == 2 and manifest is None
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def _spec_with_deletion_rules(tmp_path: Path, rules: str) -> Path:
    spec = tmp_path / "cleanup.yaml"
    spec.write_text(textwrap.dedent("""\
        name: cleanup
        entrypoint: python -c pass
        runtime_env:
          working_dir: s3://bucket/pkg.zip
        kuberay:
          deletion_rules:
        """) + textwrap.indent(textwrap.dedent(rules), "    "))
    return spec


STAGED_CLEANUP = """\
    - {job_status: FAILED, policy: DeleteWorkers, after_s: 300}
    - {job_status: FAILED, policy: DeleteCluster, after_s: 3600}
    - {job_deployment_status: Failed, policy: DeleteSelf, after_s: 86400}
    """


def test_deletion_rules_replace_the_cluster_ttl_and_pass_the_crd(tmp_path, rayjob_schema):
    code, manifest, stderr = export(str(_spec_with_deletion_rules(tmp_path, STAGED_CLEANUP)))
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    assert manifest["spec"]["deletionStrategy"] == {"deletionRules": [
        {"condition": {"jobStatus": "FAILED", "ttlSeconds": 300}, "policy": "DeleteWorkers"},
        {"condition": {"jobStatus": "FAILED", "ttlSeconds": 3600}, "policy": "DeleteCluster"},
        {"condition": {"jobDeploymentStatus": "Failed", "ttlSeconds": 86400}, "policy": "DeleteSelf"},
    ]}
    # KubeRay refuses either beside deletion rules.
    assert "shutdownAfterJobFinishes" not in manifest["spec"] and "ttlSecondsAfterFinished" not in manifest["spec"]
    assert "RayJobDeletionPolicy feature gate" in stderr
    assert "no deletion rule deletes the cluster of a job that ends SUCCEEDED" in stderr


def test_deletion_rules_on_an_existing_cluster_may_delete_only_the_rayjob(tmp_path, rayjob_schema):
    spec = _spec_with_deletion_rules(tmp_path, "- {job_status: SUCCEEDED, policy: DeleteSelf, after_s: 60}\n")
    code, manifest, stderr = export(str(spec), "--cluster", "shared")
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)
    assert manifest["spec"]["deletionStrategy"]["deletionRules"] == [
        {"condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 60}, "policy": "DeleteSelf"}]

    code, manifest, stderr = export(str(_spec_with_deletion_rules(tmp_path, STAGED_CLEANUP)), "--cluster", "shared")
    assert code == 2 and manifest is None
    assert "kuberay.deletion_rules say DeleteCluster and DeleteWorkers, which KubeRay refuses" in stderr


def test_deletion_rules_for_a_queued_spec_are_refused_as_kueue_would(tmp_path):
    code, manifest, stderr = export(str(_spec_with_deletion_rules(tmp_path, STAGED_CLEANUP)), "--set",
                                    "queue=team-a")
    assert code == 2 and manifest is None
    assert "kuberay.deletion_rules cannot go with queue (team-a)" in stderr
    assert "shutdownAfterJobFinishes" in stderr


@pytest.mark.parametrize("rules, message", [
    pytest.param("- {policy: DeleteCluster}\n", "kuberay.deletion_rules[0]: has no condition", id="no condition"),
    pytest.param("- {job_status: FAILED, job_deployment_status: Failed, policy: DeleteCluster}\n",
                 "kuberay.deletion_rules[0]: gives both job_status and job_deployment_status", id="two conditions"),
    pytest.param("- {job_status: FAILED, policy: DeleteCluster}\n- {job_status: FAILED, policy: DeleteCluster}\n",
                 "kuberay.deletion_rules: rules 1 and 2 both say DeleteCluster on job_status FAILED", id="duplicate"),
    pytest.param("- {job_status: FAILED, policy: DeleteSelf, after_s: 10}\n"
                 "- {job_status: FAILED, policy: DeleteCluster, after_s: 60}\n",
                 "on job_status FAILED, rule 1 (DeleteSelf after 10 s) comes before rule 2 (DeleteCluster after "
                 "60 s)", id="out of order"),
    pytest.param("- {job_status: FAILED, policy: DeleteCluster, after_s: -1}\n",
                 "kuberay.deletion_rules[0].after_s", id="negative"),
    pytest.param("- {job_status: FAILED, policy: DeleteCluster, after_s: '60'}\n",
                 "kuberay.deletion_rules[0].after_s: Input should be a valid integer", id="text seconds"),
    pytest.param("- {job_status: SUCCEDED, policy: DeleteCluster}\n", "kuberay.deletion_rules[0].job_status",
                 id="misspelled status"),
    pytest.param("- {job_status: FAILED, policy: DeleteAll}\n", "kuberay.deletion_rules[0].policy",
                 id="unknown policy"),
    pytest.param("[]\n", "kuberay.deletion_rules: List should have at least 1 item", id="empty"),
])
def test_deletion_rules_kuberay_would_refuse_are_bad_input_naming_the_field(tmp_path, rules, message):
    code, manifest, stderr = export(str(_spec_with_deletion_rules(tmp_path, rules)))
    assert code == 2 and manifest is None
    assert message in stderr, stderr


@pytest.mark.parametrize(("field", "mutate", "broken_rule"), [
    pytest.param("spec.shutdownAfterJobFinishes", _set_to(True), "shutdownAfterJobFinishes and deletionRules",
                 id="deletion rules beside shutdownAfterJobFinishes"),
    pytest.param("spec.deletionStrategy.deletionRules.0.condition.jobDeploymentStatus", _set_to("Failed"),
                 "one condition per rule", id="a rule with two conditions"),
    pytest.param("spec.deletionStrategy.deletionRules.1.condition.ttlSeconds", _set_to(1),
                 "TTLs out of KubeRay's deletion order", id="TTLs out of order"),
    pytest.param("spec.managedBy", _set_to("kueue.x-k8s.io/elsewhere"),
                 "is not a manager KubeRay knows", id="managedBy no one knows"),
])
def test_the_operator_rules_reject_deletion_rules_and_managers_kuberay_refuses(
        tmp_path, rayjob_schema, field, mutate, broken_rule):
    code, manifest, stderr = export(str(_spec_with_deletion_rules(tmp_path, STAGED_CLEANUP)))
    assert code == 0, stderr
    assert_valid_rayjob(manifest, rayjob_schema)  # intact, the same manifest passes
    mutate(*_parent_and_key(manifest, field))
    with pytest.raises(AssertionError, match=re.escape(broken_rule)):
        assert_operator_rules(manifest)


def test_the_kueue_rules_reject_a_multikueue_rayjob_without_a_queue(rayjob_schema):
    code, manifest, stderr = export("specs/food101.yaml", "--set", REMOTE_WORKING_DIR, "--set", "queue=team-a",
                                    "--multikueue")
    assert code == 0, stderr
    del manifest["metadata"]["labels"]
    with pytest.raises(AssertionError, match="a MultiKueue RayJob needs a queue"):
        assert_operator_rules(manifest)
