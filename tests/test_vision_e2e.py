"""The vision workload end to end: `rayjobs submit` of the shipped specs on the session cluster."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from tests.cli_helpers import FOOD101_SAMPLE, run_rayjobs
from tests.cli_helpers import read_metrics_csv as read_metrics
from tests.cli_helpers import submit_spec as submit
from tests.conftest import wait_for_condition

pytestmark = pytest.mark.cluster


def test_quickstart_spec_end_to_end(ray_cluster, ray_cluster_home, tmp_path):
    data_dir, results = tmp_path / "data", tmp_path / "results"
    result = submit(ray_cluster_home, "specs/quickstart.yaml",
                    f"workload.data.output_dir={data_dir}", f"workload.storage_path={results}",
                    "workload.data.synthetic_per_class=60", "workload.train.epochs=2", "workload.train.batch_size=32",
                    "workload.run_name=e2e")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "SUCCEEDED" in result.stderr

    manifest = json.loads((data_dir / "_manifest.json").read_text())
    train_rows = pq.ParquetDataset(data_dir / "train").read(columns=["label"]).num_rows
    val_rows = pq.ParquetDataset(data_dir / "val").read(columns=["label"]).num_rows
    assert (train_rows, val_rows) == (manifest["counts"]["train"], manifest["counts"]["val"]) == (480, 120)

    run_dir = results / "e2e"
    metrics = read_metrics(run_dir)
    assert [int(row["epoch"]) for row in metrics] == [1, 2]
    # The summary says where each of the spec's two training workers ran.
    assert re.search(r"Training workers: rank 0 on node \w{8}, rank 1 on node \w{8} \(1 node\)", result.stdout), \
        result.stdout[-2000:]
    assert (run_dir / "loss_curve.png").stat().st_size > 1000
    assert (run_dir / "confusion_matrix.png").stat().st_size > 1000
    assert list(run_dir.glob("checkpoint_*"))

    predictions = pq.read_table(run_dir / "predictions").to_pylist()
    assert len(predictions) == val_rows
    recomputed = sum(row["label"] == row["predicted_label"] for row in predictions) / len(predictions)
    reported = json.loads((run_dir / "inference_metrics.json").read_text())
    assert reported["rows"] == val_rows
    assert reported["accuracy"] == pytest.approx(recomputed)
    assert sum(map(sum, reported["confusion_matrix"])) == val_rows
    assert f"{reported['accuracy']:.4f}" in result.stdout
    # Well above chance (10 classes) after two short epochs on the generated patterns.
    assert recomputed > 0.25

    # Same run name, more epochs: training resumes after epoch 2 instead of starting over.
    again = submit(ray_cluster_home, "specs/quickstart.yaml",
                   f"workload.data.output_dir={data_dir}", f"workload.storage_path={results}",
                   "workload.data.synthetic_per_class=60", "workload.train.epochs=3", "workload.train.batch_size=32",
                   "workload.run_name=e2e",
                   "workload.stages=[preprocess, train]")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "preprocess: reusing" in again.stdout
    assert [int(row["epoch"]) for row in read_metrics(run_dir)] == [1, 2, 3]


@pytest.mark.skipif(not FOOD101_SAMPLE.is_dir(),
                    reason=f"the real Food-101 sample photos are not at {FOOD101_SAMPLE}")
def test_food101_spec_on_real_photos(ray_cluster, ray_cluster_home, tmp_path):
    # Food-101 folder names are accepted as class names, as are display names.
    classes = sorted(p.name for p in (FOOD101_SAMPLE / "images").iterdir() if p.is_dir())
    result = submit(ray_cluster_home, "specs/food101.yaml",
                    f"workload.data.root={FOOD101_SAMPLE}", f"workload.data.classes={json.dumps(classes)}",
                    f"workload.data.output_dir={tmp_path / 'data'}", f"workload.storage_path={tmp_path / 'results'}",
                    "workload.data.image_size=48", "workload.train.epochs=1", "workload.train.num_workers=2",
                    "workload.train.cpus_per_worker=1", "workload.train.loader_workers=0",
                    "workload.train.batch_size=16", "workload.train.warmup_epochs=0",
                    "workload.infer.num_actors=1", "workload.infer.cpus_per_actor=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    manifest = json.loads((tmp_path / "data" / "_manifest.json").read_text())
    assert manifest["counts"] == {"train": 72, "val": 24}
    predictions = pq.read_table(tmp_path / "results" / "food101-lite" / "predictions")
    assert predictions.num_rows == 24


def test_stopped_mid_training_then_resubmitted_resumes(ray_cluster, ray_cluster_home, tmp_path):
    results = tmp_path / "results"
    run_dir = results / "stopped"
    overrides = [f"workload.data.output_dir={tmp_path / 'data'}", f"workload.storage_path={results}",
                 "workload.data.synthetic_per_class=24", "workload.data.image_size=24", "workload.train.epochs=4",
                 "workload.train.batch_size=32", "workload.run_name=stopped", "workload.stages=[preprocess, train]"]
    args = [arg for override in overrides for arg in ("--set", override)]
    submitted = run_rayjobs("submit", "specs/quickstart.yaml", *args, "--no-wait", home=ray_cluster_home)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    def first_epoch_checkpointed() -> bool:
        snapshot = run_dir / "checkpoint_manager_snapshot.json"
        return snapshot.exists() and "checkpoint_epoch_0001" in snapshot.read_text()

    wait_for_condition(first_epoch_checkpointed, timeout_s=240, interval_s=0.5)
    stopped = run_rayjobs("stop", job_id, "--wait", home=ray_cluster_home)
    assert stopped.returncode == 0, stopped.stderr
    done_before_stop = [int(row["epoch"]) for row in read_metrics(run_dir)]
    assert done_before_stop and done_before_stop[-1] < 4, "the job was meant to be stopped mid-training"

    again = submit(ray_cluster_home, "specs/quickstart.yaml", *overrides)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "Resuming run 'stopped' after epoch" in again.stdout
    epochs = [int(row["epoch"]) for row in read_metrics(run_dir)]
    assert epochs == [1, 2, 3, 4], "every epoch once: resumed, not restarted"
