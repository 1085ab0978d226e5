"""MNIST and CIFAR-10 ViT specs end to end, and Ray Data vs PyTorch ingestion (session cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.cli_helpers import read_metrics_csv as read_metrics
from tests.cli_helpers import submit_spec as submit
from tests.fixtures_arrays import write_cifar_batches, write_cifar_parquet, write_digits_as_mnist

pytestmark = pytest.mark.cluster

TINY_VIT = ["workload.train.vit.num_layers=2", "workload.train.vit.num_heads=2", "workload.train.vit.hidden_dim=32",
            "workload.train.vit.mlp_dim=64", "workload.train.use_gpu=false", "workload.infer.use_gpu=false",
            "workload.train.warmup_epochs=0", "workload.train.batch_size=32", "workload.infer.num_actors=1",
            "workload.infer.cpus_per_actor=1"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    pytest.importorskip("sklearn", reason="scikit-learn (a test dependency) provides the handwritten digits")
    root = tmp_path_factory.mktemp("digits")
    assert write_digits_as_mnist(root) == (1438, 359)
    return root


@pytest.fixture(scope="module")
def digits_runs(ray_cluster, ray_cluster_home, digits, tmp_path_factory):
    """The mnist spec on scikit-learn's digits, once per ingestion mode, same data and seed."""
    work = tmp_path_factory.mktemp("digits-runs")
    runs = {}
    for ingest in ("ray_data", "torch"):
        result = submit(ray_cluster_home, "specs/mnist.yaml", f"workload.data.root={digits}",
                        f"workload.data.output_dir={work / 'parquet'}", f"workload.storage_path={work / 'results'}",
                        f"workload.run_name=digits-{ingest}", f"workload.train.ingest={ingest}")
        runs[ingest] = {"result": result, "run_dir": work / "results" / f"digits-{ingest}", "data": work / "parquet"}
    return runs


def test_mnist_spec_learns_real_handwritten_digits_with_ray_data(digits_runs):
    run = digits_runs["ray_data"]
    result = run["result"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "SUCCEEDED" in result.stderr
    manifest = json.loads((run["data"] / "_manifest.json").read_text())
    assert manifest["counts"] == {"train": 1438, "val": 359} and manifest["layout"]["encoding"] == "raw"

    rows = read_metrics(run["run_dir"])
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["val_accuracy"] >= 0.90, rows
    # The per-epoch breakdown: time blocked on data plus compute never exceeds the epoch.
    assert all(0 <= r["data_wait_s"] and 0 < r["compute_s"] and r["data_wait_s"] + r["compute_s"] <= r["epoch_s"]
               for r in rows)
    meta = json.loads(sorted(run["run_dir"].glob("checkpoint_*/meta.json"))[-1].read_text())
    assert meta["val_rows"] == 359  # every validation row counted once

    predictions = pq.read_table(run["run_dir"] / "predictions").to_pylist()
    assert len(predictions) == 359
    reported = json.loads((run["run_dir"] / "inference_metrics.json").read_text())
    assert reported["accuracy"] == pytest.approx(sum(p["label"] == p["predicted_label"] for p in predictions) / 359)
    assert (run["run_dir"] / "loss_curve.png").stat().st_size > 1000


def test_torch_and_ray_data_ingestion_reach_the_same_accuracy(digits_runs):
    torch_run = digits_runs["torch"]
    assert torch_run["result"].returncode == 0, torch_run["result"].stdout[-3000:] + torch_run["result"].stderr[-2000:]
    assert "preprocess: reusing" in torch_run["result"].stdout  # same Parquet dataset for both
    accuracy = {mode: read_metrics(run["run_dir"])[-1]["val_accuracy"] for mode, run in digits_runs.items()}
    assert accuracy["torch"] >= 0.90
    # 359 validation images: 0.04 is 14 images, well beyond the two modes' usual gap of a few.
    assert abs(accuracy["torch"] - accuracy["ray_data"]) <= 0.04, accuracy


@pytest.mark.parametrize("spec, layout", [("specs/cifar10-vit.yaml", "batches"), ("specs/cifar10-vit-torch.yaml", "parquet")])
def test_cifar10_vit_specs_run_on_both_source_formats(ray_cluster, ray_cluster_home, tmp_path, spec, layout):
    writer = write_cifar_batches if layout == "batches" else write_cifar_parquet
    root = writer(tmp_path / "cifar", 8, 5)
    # Three classes and two workers: 15 validation rows cannot be split evenly.
    result = submit(ray_cluster_home, spec, f"workload.data.root={root}", f"workload.data.output_dir={tmp_path / 'pq'}",
                    f"workload.storage_path={tmp_path / 'results'}", "workload.data.classes=[cat, ship, truck]",
                    "workload.train.epochs=1", "workload.train.num_workers=2", "workload.train.cpus_per_worker=1",
                    "workload.train.data_cpus=0", "workload.train.loader_workers=0", *TINY_VIT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    run_dir = next((tmp_path / "results").iterdir())
    rows = read_metrics(run_dir)
    assert [int(r["epoch"]) for r in rows] == [1]
    meta = json.loads(sorted(run_dir.glob("checkpoint_*/meta.json"))[-1].read_text())
    assert meta["val_rows"] == 15
    import torch

    state_config = torch.load(sorted(run_dir.glob("checkpoint_*/state.pt"))[-1], map_location="cpu",
                              weights_only=False)["config"]
    assert state_config["train"]["model"] == "vit" and state_config["layout"]["channels"] == 3
    assert pq.read_table(run_dir / "predictions").num_rows == 15
