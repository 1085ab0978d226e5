"""Inference stage of the vision workload: batch predictions with Ray Data, single images, entry points.

The Ray tests read the batch inference the session's shared run ends with (tests/support/tiny_run.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO_ROOT
from tests.support.ray_instances import driver_env_joining_this_ray
from tests.support.tiny_run import CLASSES, VAL_PER_CLASS


def test_batch_predictions_match_reported_metrics(tiny_run):
    import pyarrow.parquet as pq

    run_dir, params = tiny_run.outcome.run_dir, tiny_run.params
    metrics = tiny_run.inference
    table = pq.read_table(run_dir / "predictions")
    assert set(table.column_names) >= {"path", "label", "predicted_label", "predicted_class", "confidence"}
    val_rows = sum(pq.read_metadata(f).num_rows for f in (Path(params.data.output_dir) / "val").glob("*.parquet"))
    assert table.num_rows == val_rows == metrics["rows"] == len(CLASSES) * VAL_PER_CLASS
    assert sorted(table.column("path").to_pylist()) == sorted(
        f"val/{name}/{i:04d}.jpg" for name in CLASSES for i in range(VAL_PER_CLASS))

    labels = table.column("label").to_pylist()
    predicted = table.column("predicted_label").to_pylist()
    assert metrics["accuracy"] == pytest.approx(sum(a == b for a, b in zip(labels, predicted)) / len(labels))
    assert [CLASSES[i] for i in predicted] == table.column("predicted_class").to_pylist()
    assert all(0 < c <= 1 for c in table.column("confidence").to_pylist())
    # One node here: every row names it, and the metrics count it.
    assert len(set(table.column("node_id").to_pylist())) == metrics["nodes"] == 1

    matrix = metrics["confusion_matrix"]
    assert sum(map(sum, matrix)) == table.num_rows
    assert [sum(row) for row in matrix] == [VAL_PER_CLASS] * len(CLASSES)
    assert sum(matrix[i][i] for i in range(3)) == metrics["correct"]

    saved = json.loads((run_dir / "inference_metrics.json").read_text())
    assert saved["accuracy"] == metrics["accuracy"] and saved["confusion_matrix"] == matrix
    assert (run_dir / "confusion_matrix.png").stat().st_size > 1000
    assert (run_dir / "loss_curve.png").stat().st_size > 1000
    assert not list(run_dir.glob(".predictions.*"))  # staging directory gone


def test_the_checkpoint_used_is_the_runs_best_and_agrees_with_single_process_inference(tiny_run):
    import torch

    from workloads.vision.reading.torch_dataset import ParquetImageDataset, split_files
    from workloads.vision.images import normalize
    from workloads.vision.inference.classify import load_checkpoint_model

    outcome, metrics, params = tiny_run.outcome, tiny_run.inference, tiny_run.params
    assert Path(metrics["checkpoint"]) == outcome.best_checkpoint
    loaded = load_checkpoint_model(outcome.best_checkpoint)
    dataset = ParquetImageDataset(split_files(Path(params.data.output_dir), "val"), loaded.layout)
    with torch.no_grad():
        logits = loaded.model(normalize(torch.stack([dataset[i][0] for i in range(len(dataset))]), loaded.layout))
    correct = int((logits.argmax(1) == torch.tensor([dataset[i][1] for i in range(len(dataset))])).sum())
    assert correct == metrics["correct"]
    # Training evaluated the same checkpoint on the same split.
    assert outcome.best_metrics["val_accuracy"] == pytest.approx(metrics["accuracy"])


def test_confusion_helpers():
    import numpy as np

    from workloads.vision.inference.stage import confusion_matrix
    from workloads.vision.inference.confusion import confusion_table

    matrix = confusion_matrix(np.array([0, 0, 1, 2, 2]), np.array([0, 1, 1, 2, 0]), 3)
    assert matrix == [[1, 1, 0], [0, 1, 0], [1, 0, 1]]
    table = confusion_table(matrix, ["pizza", "fried rice", "ramen"])
    lines = table.splitlines()
    assert lines[0].startswith("true \\ pred") and len(lines) == 5
    assert "50.0%" in lines[2] and "100.0%" in lines[3]


def test_the_actor_pool_is_no_larger_than_the_batches_it_has_to_classify():
    from workloads.vision.config import InferConfig
    from workloads.vision.inference.stage import actors_for

    config = InferConfig(batch_size=128, num_actors=2)
    # 48 images are one batch: a second actor would import torch and load the model for nothing.
    assert [actors_for(config, rows) for rows in (0, 1, 48, 128, 129, 3000)] == [1, 1, 1, 1, 2, 2]
    assert actors_for(config, None) == 2 and actors_for(InferConfig(batch_size=16, num_actors=8), 40) == 3


def _run_module(args: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    # In a `ray` test the module's ray.init() joins the session's in-process Ray, as a job's driver
    # joins its cluster; elsewhere the module must fail before it needs Ray at all.
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout,
                          env=driver_env_joining_this_ray(), cwd=REPO_ROOT)


def test_single_image_task_and_predict_cli(tiny_run, tmp_path):
    import ray

    from workloads.vision.inference.classify import classify_image_task

    outcome, params = tiny_run.outcome, tiny_run.params
    val_file = sorted((Path(params.data.output_dir) / "val").glob("*.parquet"))[0]
    import pyarrow.parquet as pq

    image = pq.read_table(val_file, columns=["image"]).column("image")[0].as_py()
    result = ray.get(classify_image_task.remote(str(outcome.best_checkpoint), image))  # Ray of `workload_ray`
    assert result["predicted_class"] in CLASSES and CLASSES[result["predicted_label"]] == result["predicted_class"]
    assert 0 < result["confidence"] <= 1 and result["top"][0][0] == result["predicted_class"]

    image_file = tmp_path / "one.jpg"
    image_file.write_bytes(image)
    params_file = tmp_path / "params.json"
    params_file.write_text(params.model_dump_json(), encoding="utf-8")
    done = _run_module(["workloads.vision.inference.predict", "--params", str(params_file), str(image_file),
                        f"{val_file}:3"])
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith((str(image_file), str(val_file)))]
    assert len(lines) == 2
    assert lines[0].startswith(f"{image_file}: {result['predicted_class']} ({result['confidence']:.1%})")
    assert "(true label" in lines[1]


def test_entry_point_reports_a_missing_dataset_in_one_line(tmp_path):
    spec = tmp_path / "params.yaml"
    spec.write_text(f"stages: [train]\nrun_name: x\nstorage_path: {tmp_path}\ndata:\n  output_dir: {tmp_path / 'none'}\n")
    done = _run_module(["workloads.vision", "--params", str(spec)], timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "preprocess" in error_lines[0]


def test_the_infer_stage_runs_alone_on_an_existing_run(tiny_run):
    # The shared run's inference is the stage runner the entry point calls, with `stages: [infer]`, in
    # this process (the entry point itself, with its connection to the cluster, runs in every
    # `rayjobs submit` of the cluster tier).
    printed, params = tiny_run.infer_printed, tiny_run.params
    assert "Stage 1/1: Infer" in printed and "Train" not in printed
    assert f"Best checkpoint: {params.run_dir / tiny_run.outcome.best_checkpoint.name}" in printed
    assert f"Inference accuracy: {tiny_run.inference['accuracy']:.4f}" in printed
    assert "rayjobs-event {" in printed  # the stage's progress events, for a follower to read

def test_a_small_split_is_classified_in_the_jobs_own_process_as_the_pool_classifies_it(tiny_run, tmp_path, capsys):
    import pyarrow.parquet as pq

    from workloads.vision.inference.stage import run_batch_inference

    params = tiny_run.params
    auto = params.model_copy(update={"infer": params.infer.model_copy(update={"num_actors": "auto"})})
    metrics = run_batch_inference(auto, run_dir=tmp_path, checkpoint_dir=tiny_run.outcome.best_checkpoint)
    printed = capsys.readouterr().out
    assert "in this process with" in printed and "actor(s)" not in printed, printed

    def by_path(table) -> dict:
        return {path: (label, predicted) for path, label, predicted in
                zip(table["path"], table["label"], table["predicted_label"])}

    ours = pq.read_table(tmp_path / "predictions").to_pydict()
    pool = pq.read_table(tiny_run.outcome.run_dir / "predictions").to_pydict()
    assert by_path(ours) == by_path(pool)
    assert metrics["rows"] == tiny_run.inference["rows"] and metrics["accuracy"] == tiny_run.inference["accuracy"]
    assert metrics["nodes"] == 1 and set(ours["precision"]) == set(pool["precision"])
    assert (tmp_path / "confusion_matrix.png").stat().st_size > 1000


def test_auto_classifies_in_process_only_what_a_pool_would_not_pay_for():
    from workloads.vision.config import InferConfig

    auto = InferConfig()
    assert auto.classifies_in_process(3000, 64 * 64, 1.0)  # the 64 px development set's test split
    assert not auto.classifies_in_process(3000, 224 * 224, 1.0)  # at 224 px, a pool's start pays for itself
    assert not auto.classifies_in_process(3000, 64 * 64, 8.0)  # a cluster of eight such nodes: the pool spreads
    assert not InferConfig(num_actors=2).classifies_in_process(10, 64 * 64, 1.0)  # a pool asked for is a pool
    assert not InferConfig(use_gpu=True).classifies_in_process(10, 64 * 64, 1.0)
    assert auto.pool_size(cluster_cpus=6) == 6 and InferConfig(num_actors=2).pool_size(cluster_cpus=6) == 2


def test_an_empty_validation_split_is_one_clear_error_and_leaves_no_predictions(tiny_run, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    from workloads.vision.errors import InferenceError
    from workloads.vision.inference.stage import run_batch_inference

    dataset = tmp_path / "data"
    shutil.copytree(tiny_run.dataset, dataset)
    for part in (dataset / "val").glob("*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.slice(0, 0), part)  # the schema kept, no rows
    params = tiny_run.params
    auto = params.model_copy(update={"infer": params.infer.model_copy(update={"num_actors": "auto"})})
    with pytest.raises(InferenceError, match="no images"):
        run_batch_inference(auto, dataset_root=dataset, run_dir=tmp_path / "run",
                            checkpoint_dir=tiny_run.outcome.best_checkpoint)
    assert not (tmp_path / "run" / "predictions").exists()
