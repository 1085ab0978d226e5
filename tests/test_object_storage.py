"""Object storage without a Ray cluster: s3:// in specs, the storage helper, the dataset and run files in S3.

Everything runs against a real S3 server (moto's, on loopback); nothing is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.errors import SpecError
from jobs.loader import load_spec
from rayjobs_agent.s3_access import ObjectStoreAuthFailed, ObjectStoreMissing, ObjectStoreUnreachable
from jobs.secrets import looks_secret
from tests.support.cli import REPO_ROOT, cli_env, run_rayjobs
from tests.support.arrays import write_pattern_mnist
from tests.support.s3_server import closed_port_endpoint, create_bucket, object_keys
from tests.support.waiting import HANG_GUARD_S
from workloads import storage
from workloads.storage import ObjectPath

BUCKET = "rayjobs-storage"
QUICKSTART = REPO_ROOT / "specs" / "quickstart.yaml"


@pytest.fixture
def bucket(aws_env, s3_endpoint) -> str:
    create_bucket(s3_endpoint, BUCKET)
    return BUCKET


@pytest.fixture
def refusing_keys(monkeypatch):
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks keys from now on
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")


# --------------------------------------------------------------------------- spec fields


def test_storage_path_keeps_an_s3_uri_instead_of_a_local_path():
    loaded = load_spec(QUICKSTART, ["workload.storage_path=s3://bucket/results",
                                    "workload.data.output_dir=s3://bucket/data/quickstart/"])
    assert loaded.workload.storage_path == "s3://bucket/results"
    assert loaded.workload.data.output_dir == "s3://bucket/data/quickstart"
    assert loaded.workload.run_dir == ObjectPath("s3://bucket/results/quickstart")
    local = load_spec(QUICKSTART, ["workload.storage_path=results"])
    assert local.workload.storage_path == QUICKSTART.parent / "results"


@pytest.mark.processes
def test_validate_accepts_s3_for_storage_path_and_refuses_it_elsewhere():
    accepted = run_rayjobs("validate", str(QUICKSTART), "--set", "workload.storage_path=s3://bucket/results")
    assert accepted.returncode == 0, accepted.stderr
    for field in ("workload.data.root", "workload.train.weights"):
        refused = run_rayjobs("validate", str(QUICKSTART), "--set", f"{field}=s3://bucket/x")
        assert refused.returncode == 2, refused.stderr
        assert field in refused.stderr and "takes a local path" in refused.stderr
        assert "Traceback" not in refused.stderr
    for bad, words in {"gs://bucket/x": "gs:// is not supported", "s3://No_Bucket/x": "is not s3://BUCKET"}.items():
        refused = run_rayjobs("validate", str(QUICKSTART), "--set", f"workload.storage_path={bad}")
        assert refused.returncode == 2 and "workload.storage_path" in refused.stderr and words in refused.stderr


def test_hf_vit_data_path_refuses_a_uri(tmp_path):
    from workloads.hf_vit.config import HFViTParams

    with pytest.raises(ValueError, match="takes a local path"):
        HFViTParams.model_validate({"data": {"path": "s3://bucket/data"}})
    with pytest.raises(ValueError, match="takes a local path"):
        HFViTParams.model_validate({"data": {"path": str(tmp_path)}, "model": {"weights": "s3://bucket/w"}})


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"])
def test_aws_credentials_are_masked(name):
    assert looks_secret(name)


# --------------------------------------------------------------------------- the storage helper


def test_a_file_uri_is_a_local_path_as_the_client_takes_it(tmp_path):
    assert storage.storage_path(f"file://{tmp_path}/runs") == tmp_path / "runs"
    assert storage.storage_path("file://localhost/data/two%20words") == Path("/data/two words")
    assert storage.local_path(storage.resolved(f"file://{tmp_path}")) == tmp_path.resolve()
    with pytest.raises(ValueError, match="names the host 'elsewhere'"):
        storage.storage_path("file://elsewhere/data")
    with pytest.raises(ValueError, match="gs:// is not supported"):
        storage.storage_path("gs://bucket/data")


def test_filesystem_helper_reads_the_aws_variables(bucket, s3_endpoint):
    from pyarrow.fs import FileType, LocalFileSystem, S3FileSystem

    filesystem, path = storage.filesystem_and_path(f"s3://{bucket}/a/b")
    assert isinstance(filesystem, S3FileSystem) and path == f"{bucket}/a/b" and filesystem.region == "us-east-1"
    assert filesystem.get_file_info(bucket).type == FileType.Directory  # reached the server of AWS_ENDPOINT_URL
    local, local_path = storage.filesystem_and_path("relative/x")
    assert isinstance(local, LocalFileSystem) and Path(local_path).is_absolute()


def test_files_are_written_listed_read_and_deleted_in_s3(bucket, s3_endpoint):
    folder = ObjectPath(f"s3://{bucket}/things")
    storage.write_text(folder / "a.txt", "alpha")
    storage.write_bytes(folder / "sub" / "b.bin", b"\x00\x01")
    storage.write_with(folder / "c.csv", lambda tmp: Path(tmp).write_text("x,y\n"))
    assert object_keys(s3_endpoint, bucket, "things/") == ["things/a.txt", "things/c.csv", "things/sub/b.bin"]
    assert storage.read_text(folder / "a.txt") == "alpha" and storage.file_size(folder / "sub" / "b.bin") == 2
    assert storage.list_files(folder, ".txt") == [folder / "a.txt"]
    assert len(storage.list_files(folder, recursive=True)) == 3
    assert storage.exists(folder) and not storage.exists(folder / "nothing")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(folder / "nothing")
    storage.delete_tree(folder)
    assert object_keys(s3_endpoint, bucket, "things/") == [] and not storage.exists(folder)


def test_a_missing_bucket_names_the_field_and_the_bucket(aws_env):
    with pytest.raises(ObjectStoreMissing, match=r"storage_path s3://no-such-bucket/runs: bucket 'no-such-bucket' "
                                                   r"does not exist at http://127\.0\.0\.1:\d+; create it"):
        storage.check_storage(ObjectPath("s3://no-such-bucket/runs"), "storage_path")


def test_refused_credentials_name_the_variables(bucket, refusing_keys):
    with pytest.raises(ObjectStoreAuthFailed) as refused:
        storage.check_storage(ObjectPath(f"s3://{bucket}/runs"), "storage_path")
    message = str(refused.value)
    assert "refused access" in message and "AWS_SECRET_ACCESS_KEY" in message and "wrong-secret" not in message


@pytest.mark.processes
@pytest.mark.timeout(HANG_GUARD_S)
def test_an_unreachable_endpoint_fails_without_hanging(aws_env, monkeypatch):
    closed = closed_port_endpoint()
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(ObjectStoreUnreachable, match=f"cannot reach the object store at {closed}.*AWS_ENDPOINT_URL"):
        storage.check_storage(ObjectPath("s3://some-bucket/runs"), "data.output_dir")


# --------------------------------------------------------------------------- run files and datasets in S3


@pytest.mark.processes
def test_metrics_loss_curve_and_tensorboard_events_are_written_to_s3(bucket, s3_endpoint, tmp_path):
    from tests.support.tensorboard_events import tensorboard_scalars
    from workloads.ray_train.metrics import read_metrics_csv, write_run_metrics

    run_dir = ObjectPath(f"s3://{bucket}/runs/curve")
    rows = [{"epoch": e, "train_loss": 2.0 / e, "val_loss": 2.5 / e, "val_accuracy": 0.2 * e} for e in (1, 2)]
    write_run_metrics(run_dir, rows)
    assert object_keys(s3_endpoint, bucket, "runs/curve/") == [
        "runs/curve/loss_curve.png", "runs/curve/metrics.csv", "runs/curve/tensorboard/events.out.tfevents.rayjobs"]
    assert read_metrics_csv(run_dir / "metrics.csv") == [{**row, "epoch": float(row["epoch"])} for row in rows]
    assert storage.read_bytes(run_dir / "loss_curve.png")[:8] == b"\x89PNG\r\n\x1a\n"
    events = tmp_path / "events"
    events.mkdir()
    (events / "events.out.tfevents.rayjobs").write_bytes(
        storage.read_bytes(run_dir / "tensorboard" / "events.out.tfevents.rayjobs"))
    assert tensorboard_scalars(events)["val_loss"] == [(1, 2.5), (2, 1.25)]


def _mnist_data(tmp_path: Path, output_dir: str, **extra):
    from workloads.vision.config import DataConfig

    root = tmp_path / "mnist"
    if not root.exists():
        write_pattern_mnist(root, {"train": 6, "test": 2})
    return DataConfig.model_validate({"source": "mnist", "root": str(root), "output_dir": output_dir,
                                      "rows_per_file": 16, **extra})


@pytest.mark.processes
def test_preprocess_writes_parquet_and_manifest_last_and_reuses_them(bucket, s3_endpoint, tmp_path, capsys):
    from workloads.storage import WRITING_MARKER
    from workloads.vision.preprocess.stage import run_preprocess
    from workloads.vision.reading.manifest import MANIFEST_NAME, load_dataset_info
    from workloads.vision.reading.torch_dataset import ParquetImageDataset, split_files

    data = _mnist_data(tmp_path, f"s3://{bucket}/datasets/digits")
    info = run_preprocess(data, progress=False)
    assert info.root == ObjectPath(f"s3://{bucket}/datasets/digits") and info.counts == {"train": 60, "val": 20}
    keys = object_keys(s3_endpoint, bucket, "datasets/digits/")
    assert f"datasets/digits/{MANIFEST_NAME}" in keys and f"datasets/digits/{WRITING_MARKER}" not in keys
    assert sum(key.endswith(".parquet") for key in keys) == 4 + 2  # 60 train rows in 16s, 20 val rows

    files = split_files(info.root, "train")
    dataset = ParquetImageDataset(files, info.layout)
    assert len(dataset) == 60 and dataset[0][0].shape == (1, 28, 28)
    assert load_dataset_info(f"s3://{bucket}/datasets/digits").counts == info.counts

    again = run_preprocess(data, progress=False)
    assert again.reused and "preprocess: reusing s3://rayjobs-storage/datasets/digits" in capsys.readouterr().out

    # A rebuild that fails halfway leaves no manifest: the prefix is no longer taken as a dataset...
    from workloads.vision.errors import DataSourceError
    from workloads.vision.preprocess import writing as dataset_format

    original_close = dataset_format.SplitWriter.close

    def fail_on_close(writer):
        raise RuntimeError("disk full")

    dataset_format.SplitWriter.close = fail_on_close
    try:
        with pytest.raises(RuntimeError):
            run_preprocess(_mnist_data(tmp_path, data.output_dir, force=True), progress=False)
    finally:
        dataset_format.SplitWriter.close = original_close
    assert f"datasets/digits/{MANIFEST_NAME}" not in object_keys(s3_endpoint, bucket, "datasets/digits/")
    with pytest.raises(DataSourceError, match="no preprocessed dataset"):
        load_dataset_info(data.output_dir)
    # ...and the next run may replace what the failed one left.
    assert not run_preprocess(data, progress=False).reused
    assert f"datasets/digits/{WRITING_MARKER}" not in object_keys(s3_endpoint, bucket, "datasets/digits/")


def test_preprocess_refuses_a_prefix_holding_other_objects(bucket, s3_endpoint, tmp_path):
    from workloads.vision.errors import DataSourceError
    from workloads.vision.preprocess.stage import run_preprocess

    storage.write_text(ObjectPath(f"s3://{bucket}/precious/notes.txt"), "keep me")
    with pytest.raises(DataSourceError, match="holds objects but no _manifest.json"):
        run_preprocess(_mnist_data(tmp_path, f"s3://{bucket}/precious"), progress=False)
    assert object_keys(s3_endpoint, bucket, "precious/") == ["precious/notes.txt"]


@pytest.mark.processes
@pytest.mark.parametrize("case", ["missing bucket", "refused keys", "unreachable endpoint"])
def test_vision_entry_point_exits_2_with_one_line_before_touching_ray(case, aws_env, s3_endpoint, tmp_path,
                                                                       monkeypatch):
    import moto.settings

    create_bucket(s3_endpoint, BUCKET)
    env = cli_env(None, **aws_env, PYTHONPATH=str(REPO_ROOT))
    bucket_name = "no-such-bucket" if case == "missing bucket" else BUCKET
    if case == "refused keys":
        monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server runs in this process
        env["AWS_SECRET_ACCESS_KEY"] = "wrong-secret"
    if case == "unreachable endpoint":
        env["AWS_ENDPOINT_URL"] = closed_port_endpoint()
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"storage_path": f"s3://{bucket_name}/runs",
                                  "data": {"output_dir": f"s3://{bucket_name}/data"}}))
    # The subprocess timeout is the hang guard: it raises before any elapsed-time check could fail.
    ran = subprocess.run([sys.executable, "-m", "workloads.vision", "--params", str(params)], capture_output=True,
                         text=True, env=env, cwd=REPO_ROOT, timeout=HANG_GUARD_S)
    assert ran.returncode == 2, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: data.output_dir s3://{bucket_name}/data: "), ran.stderr
    expected = {"missing bucket": "bucket 'no-such-bucket' does not exist", "refused keys": "AWS_ACCESS_KEY_ID",
                "unreachable endpoint": "check AWS_ENDPOINT_URL"}[case]
    assert expected in lines[0] and "wrong-secret" not in lines[0]


def test_a_file_uri_in_a_spec_is_the_local_folder_it_names(tmp_path):
    # The client and the workload agree: file:// is a path on this machine, in the spec as on the cluster.
    loaded = load_spec(QUICKSTART, [f"workload.storage_path=file://localhost{tmp_path}/two%20words"])
    assert loaded.workload.storage_path == tmp_path / "two words"
    with pytest.raises(SpecError, match="names the host"):
        load_spec(QUICKSTART, ["workload.storage_path=file://elsewhere/data"])
