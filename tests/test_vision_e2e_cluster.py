"""The quickstart spec end to end through `rayjobs`, its dataset and run in S3 (moto's server on loopback).

One flow proves what a user relies on: the job is submitted, stopped by the user once its first
epoch is checkpointed, and the same spec submitted again with one epoch more reuses the dataset,
resumes after the last checkpoint (every epoch once, the schedule stretched to the new length), runs
batch inference and leaves every artefact in the run's storage, and nothing on local disk. It runs in
S3 only: every path of it goes through the storage layer that local disk shares, and the vision specs
run end to end on local disk in tests/test_vision_ingest.py and tests/test_learning_real_photos_cluster.py.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.cli import REPO_ROOT, run_rayjobs
from tests.support.cli import submit_spec as submit
from tests.support.s3_server import aws_variables, create_bucket
from tests.support.waiting import wait_for_condition
from workloads import storage
from workloads.ray_train.metrics import read_metrics_csv

BUCKET = "rayjobs-vision"
EPOCHS = 4  # the first submission asks for one fewer
PER_CLASS = 20  # 10 classes: 160 training and 40 validation images


@dataclass
class Where:
    """Where a run's dataset and results go, and what the job needs to reach them."""

    data: str
    runs: str
    job_env: dict[str, str]
    home: Path  # the job's HOME, which must stay empty: everything goes to S3

    def run_dir(self, name: str) -> storage.StoragePath:
        return storage.storage_path(f"{self.runs}/{name}")


@pytest.fixture
def where(s3_endpoint: str, aws_env: dict[str, str], tmp_path: Path) -> Where:
    """A bucket on the test S3 server (this process reads it through workloads.storage too)."""
    create_bucket(s3_endpoint, BUCKET)
    home = tmp_path / "job-home"
    home.mkdir()
    # The defaults (~/rayjobs-data, ~/rayjobs-results) and matplotlib's cache would land in HOME.
    env = {**aws_variables(s3_endpoint), "HOME": str(home), "MPLCONFIGDIR": str(tmp_path / "matplotlib")}
    return Where(data=f"s3://{BUCKET}/data/quickstart", runs=f"s3://{BUCKET}/runs", job_env=env, home=home)


def test_quickstart_in_s3_stopped_mid_training_then_submitted_again_resumes_and_finishes(ray_cluster,
                                                                                          ray_cluster_home, where):
    run_dir = where.run_dir("e2e")
    # One training worker (the spec's auto layout on the session's one node, one CPU of it so that tests
    # beside it keep theirs) and one inference replica: what the run wrote is checked here, not how many
    # processes wrote it (two workers' training is tests/test_learning_real_photos_cluster.py's and
    # tests/test_multinode_cluster.py's; each Train worker is a process that imports torch).
    overrides = [*(f"runtime_env.env_vars.{name}={value}" for name, value in where.job_env.items()),
                 f"workload.data.output_dir={where.data}", f"workload.storage_path={where.runs}",
                 f"workload.data.synthetic_per_class={PER_CLASS}", "workload.data.image_size=24",
                 "workload.train.batch_size=32", "workload.train.cpus_per_worker=1", "workload.infer.num_actors=1",
                 "workload.run_name=e2e"]
    first = [*overrides, f"workload.train.epochs={EPOCHS - 1}"]
    submitted = run_rayjobs("submit", "specs/quickstart.yaml", *[a for o in first for a in ("--set", o)],
                            "--no-wait", home=ray_cluster_home)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    def first_epoch_checkpointed() -> bool:
        snapshot = run_dir / "checkpoint_manager_snapshot.json"
        return storage.exists(snapshot) and "checkpoint_epoch_0001" in storage.read_text(snapshot)

    wait_for_condition(first_epoch_checkpointed, timeout_s=300, interval_s=0.5)
    stopped = run_rayjobs("stop", job_id, "--wait", home=ray_cluster_home)
    assert stopped.returncode == 0, stopped.stderr
    epochs_before_stop = [int(row["epoch"]) for row in read_metrics_csv(run_dir / "metrics.csv")]
    assert epochs_before_stop and epochs_before_stop[-1] < EPOCHS - 1, "the job was meant to be stopped mid-training"

    result = submit(ray_cluster_home, "specs/quickstart.yaml", *overrides, f"workload.train.epochs={EPOCHS}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "SUCCEEDED" in result.stderr
    assert "testing" not in result.stdout + result.stderr  # the test S3 keys are masked in what rayjobs prints
    assert f"preprocess: reusing {where.data}" in result.stdout
    # After the last checkpoint that was complete when the job stopped: epoch 1 at least, never a later one.
    resumed = re.search(r"Resuming run 'e2e' after epoch (\d+)", result.stdout)
    assert resumed and 1 <= int(resumed[1]) <= epochs_before_stop[-1], result.stdout[-3000:]
    rows = read_metrics_csv(run_dir / "metrics.csv")
    assert [int(row["epoch"]) for row in rows] == list(range(1, EPOCHS + 1))
    assert rows[-1]["lr"] > 0, "the schedule was stretched to the new length, not left at the old one's end"
    # The job says which layout it chose and why, and the summary where the training worker ran.
    assert "Layout: 1 worker(s) × 1 CPU, auto: one per node with a CPU free (1 node(s))" in result.stdout, \
        result.stdout[-3000:]
    assert re.search(r"Training workers: rank 0 on node \w{8} \(1 node\)", result.stdout), \
        result.stdout[-2000:]

    data = storage.storage_path(where.data)
    manifest = json.loads(storage.read_text(data / "_manifest.json"))
    assert manifest["counts"] == {"train": PER_CLASS * 8, "val": PER_CLASS * 2}
    assert {entry["path"] for entry in manifest["files"]} == {
        str(part)[len(str(data)) + 1:] for part in storage.list_files(data, suffix=".parquet", recursive=True)}

    for name in ("loss_curve.png", "confusion_matrix.png", "inference_metrics.json",
                 f"checkpoint_epoch_{EPOCHS:04d}/state.pt", f"checkpoint_epoch_{EPOCHS:04d}/meta.json"):
        assert storage.exists(run_dir / name), name
    assert storage.file_size(run_dir / "loss_curve.png") > 1000
    predictions = [pq.read_table(io.BytesIO(storage.read_bytes(part)))
                   for part in storage.list_files(run_dir / "predictions", suffix=".parquet")]
    rows = [row for table in predictions for row in table.to_pylist()]
    reported = json.loads(storage.read_text(run_dir / "inference_metrics.json"))
    assert len(rows) == reported["rows"] == manifest["counts"]["val"]
    recomputed = sum(row["label"] == row["predicted_label"] for row in rows) / len(rows)
    assert reported["accuracy"] == pytest.approx(recomputed)
    assert sum(map(sum, reported["confusion_matrix"])) == len(rows)
    assert reported["predictions"] == str(run_dir / "predictions")
    assert f"{reported['accuracy']:.4f}" in result.stdout
    assert re.search(rf"Best checkpoint: {re.escape(str(run_dir))}/checkpoint_epoch_000\d", result.stdout)
    assert recomputed > 0.25  # well above chance (10 classes) on the generated patterns

    assert list(where.home.iterdir()) == []  # nothing of the run was written on local disk
    assert not (REPO_ROOT / "specs" / "s3:").exists()
