"""The vision quickstart with its dataset and its run in S3 (moto's server on loopback), on the session cluster."""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

from tests.cli_helpers import REPO_ROOT
from tests.cli_helpers import submit_spec as submit
from tests.s3_server import aws_variables, create_bucket, object_keys, s3_client

pytestmark = pytest.mark.cluster

BUCKET = "rayjobs-vision"


def _read(endpoint: str, key: str) -> bytes:
    return s3_client(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read()


def test_quickstart_in_s3_writes_nothing_locally_and_resumes(ray_cluster, ray_cluster_home, s3_endpoint, tmp_path):
    create_bucket(s3_endpoint, BUCKET)
    # The job's home is an empty folder: the defaults (~/rayjobs-data, ~/rayjobs-results) would land there.
    home = tmp_path / "job-home"
    home.mkdir()
    # (matplotlib keeps its font cache under HOME unless MPLCONFIGDIR says elsewhere.)
    job_env = {**aws_variables(s3_endpoint), "HOME": str(home), "MPLCONFIGDIR": str(tmp_path / "matplotlib")}
    overrides = [*(f"runtime_env.env_vars.{name}={value}" for name, value in job_env.items()),
                 f"workload.data.output_dir=s3://{BUCKET}/data/quickstart", f"workload.storage_path=s3://{BUCKET}/runs",
                 "workload.data.synthetic_per_class=20", "workload.data.image_size=24", "workload.train.epochs=1",
                 "workload.train.batch_size=32", "workload.run_name=in-s3", "workload.infer.num_actors=1"]
    result = submit(ray_cluster_home, "specs/quickstart.yaml", *overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "testing" not in result.stdout + result.stderr  # the keys are masked in what rayjobs prints

    data_keys = object_keys(s3_endpoint, BUCKET, "data/quickstart/")
    manifest = json.loads(_read(s3_endpoint, "data/quickstart/_manifest.json"))
    assert {entry["path"] for entry in manifest["files"]} == {key.split("quickstart/", 1)[1] for key in data_keys
                                                              if key.endswith(".parquet")}
    assert manifest["counts"] == {"train": 160, "val": 40}

    run_keys = object_keys(s3_endpoint, BUCKET, "runs/in-s3/")
    for name in ("metrics.csv", "loss_curve.png", "confusion_matrix.png", "inference_metrics.json",
                 "checkpoint_manager_snapshot.json", "checkpoint_epoch_0001/state.pt",
                 "checkpoint_epoch_0001/meta.json"):
        assert f"runs/in-s3/{name}" in run_keys, run_keys
    predictions = [key for key in run_keys if key.startswith("runs/in-s3/predictions/") and key.endswith(".parquet")]
    rows = sum(pq.read_table(io.BytesIO(_read(s3_endpoint, key))).num_rows for key in predictions)
    reported = json.loads(_read(s3_endpoint, "runs/in-s3/inference_metrics.json"))
    assert rows == reported["rows"] == 40
    assert reported["predictions"] == f"s3://{BUCKET}/runs/in-s3/predictions"
    assert f"Best checkpoint: s3://{BUCKET}/runs/in-s3/checkpoint_epoch_0001" in result.stdout

    assert list(home.iterdir()) == []
    assert not (REPO_ROOT / "specs" / "s3:").exists()

    # The same run with one more epoch: the dataset in S3 is reused, training continues from the S3 checkpoint.
    overrides = [o for o in overrides if not o.startswith("workload.train.epochs")]
    again = submit(ray_cluster_home, "specs/quickstart.yaml", *overrides, "workload.train.epochs=2",
                   "workload.stages=[preprocess, train]")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert f"preprocess: reusing s3://{BUCKET}/data/quickstart" in again.stdout
    assert "has a checkpoint after epoch 1: continuing with epoch 2 of 2" in again.stdout
    assert "Resuming run 'in-s3' after epoch 1" in again.stdout
    metrics = _read(s3_endpoint, "runs/in-s3/metrics.csv").decode().splitlines()
    assert [line.split(",")[0] for line in metrics[1:]] == ["1", "2"]
    assert "runs/in-s3/checkpoint_epoch_0002/state.pt" in object_keys(s3_endpoint, BUCKET, "runs/in-s3/")
    assert list(home.iterdir()) == []
