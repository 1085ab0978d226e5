"""Inference stage: the best checkpoint of a run applied to the validation split.

Batch inference streams the validation Parquet through a pool of Ray Data actors, each
loading the model once (:mod:`workloads.vision.inference.classify`), and writes the
predictions, their metrics and a confusion matrix into the run's folder.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import ray

from workloads import storage
from workloads.placement import nodes_phrase
from workloads.storage import StoragePath
from workloads.ray_train.config import NodeCapacity
from workloads.ray_train.precision import AmpSetting
from workloads.ray_train.trainer import cluster_capacity
from workloads.vision.config import InferConfig, VisionParams
from workloads.vision.errors import InferenceError
from workloads.vision.inference.classify import (classify_tensors, load_checkpoint_model, load_classes,
                                                 resolve_checkpoint)
from workloads.vision.reading.manifest import load_dataset_info

PREDICTIONS_DIR = "predictions"
METRICS_FILE = "inference_metrics.json"
CONFUSION_PNG = "confusion_matrix.png"
PREDICTION_COLUMNS_READ_BACK = ["label", "predicted_label", "node_id", "precision"]


class BatchPredictor:
    """Ray Data actor: loads the checkpoint once, then classifies batches of Parquet rows."""

    def __init__(self, checkpoint_dir: str, use_gpu: bool, cpus: float, amp: AmpSetting = "auto"):
        import torch

        # Ray reserved `cpus` for this actor; more threads would fight the other actors.
        torch.set_num_threads(max(1, int(cpus)))
        # Chosen here, on the actor's node: its CPU is the one that computes.
        self.loaded = load_checkpoint_model(checkpoint_dir, use_gpu=use_gpu, amp=amp)
        self.class_names = np.array(self.loaded.classes, dtype=object)
        self.node_id = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from workloads.vision.images import decode_batch

        predicted, probabilities = classify_tensors(self.loaded, decode_batch(batch["image"], self.loaded.layout))
        return {
            "path": batch["path"],
            "label": batch["label"].astype(np.int64),
            "predicted_label": predicted.astype(np.int64),
            "predicted_class": self.class_names[predicted],
            "confidence": probabilities[np.arange(len(predicted)), predicted].astype(np.float32),
            # Which replica's node classified the row: tells placement problems apart from model ones.
            "node_id": np.full(len(predicted), self.node_id, dtype=object),
            "precision": np.full(len(predicted), self.loaded.precision.name, dtype=object),
        }


def actors_for(cfg: InferConfig, rows: int | None, cluster_cpus: float | None = None) -> int:
    """The most model actors worth starting for ``rows`` images: the pool's size (:meth:`InferConfig.pool_size`
    on ``cluster_cpus``, the connected cluster's when None), but never more than there are batches, since an
    actor costs a process that imports torch and loads the model, and one without a batch to classify only
    delays the end (``rows`` None: unknown)."""
    if cluster_cpus is None and cfg.num_actors == "auto":
        cluster_cpus = ray.cluster_resources().get("CPU", 1.0)
    most = cfg.pool_size(cluster_cpus or 1.0)
    if rows is None:
        return most
    return max(1, min(most, -(-rows // cfg.batch_size)))


def prediction_dataset(files: list[str], checkpoint_dir: str | StoragePath, cfg: InferConfig, filesystem=None,
                       amp: AmpSetting = "auto", rows: int | None = None):
    """The Ray Data pipeline of batch inference: read Parquet rows, classify them in a pool of model actors.

    ``filesystem``: the ``pyarrow.fs`` filesystem of ``files`` (None: local files); ``amp``: the spec's
    ``train.amp``, the precision each actor chooses by; ``rows``: how many rows the files hold, when known
    (the pool is then no larger than their batches, see :func:`actors_for`).
    """
    from workloads.vision.reading.ray_datasets import read_parquet_on_no_cpu

    # Reads reserve no CPU, so unbounded, Ray would run every read task at once, each in
    # a new worker process that must start and import pyarrow; beside the model actors
    # on a 2-core machine that delayed the first predictions by about 10 s. Two readers
    # keep up with actors that spend far more per row on the model.
    dataset = read_parquet_on_no_cpu(files, columns=["image", "label", "path"], max_concurrent_reads=2,
                                     filesystem=filesystem)
    # Start as many actors as the cluster fits now (the reads take no CPU, so a pool
    # holding every CPU cannot starve them); grow to `most` if nodes are added.
    most = actors_for(cfg, rows)
    resources = ray.cluster_resources()
    fits = resources.get("CPU", 0) // cfg.cpus_per_actor
    if cfg.use_gpu:
        fits = min(fits, resources.get("GPU", 0))
    start_with = int(max(1, min(most, fits)))
    return dataset.map_batches(
        BatchPredictor,
        fn_constructor_kwargs={"checkpoint_dir": str(checkpoint_dir), "use_gpu": cfg.use_gpu,
                               "cpus": cfg.cpus_per_actor, "amp": amp},
        batch_size=cfg.batch_size,
        compute=ray.data.ActorPoolStrategy(min_size=start_with, max_size=most),
        num_cpus=cfg.cpus_per_actor,
        num_gpus=1 if cfg.use_gpu else 0,
        batch_format="numpy",
    )


def predictions_in_process(files: list[str], checkpoint_dir: str | StoragePath, batch_size: int, threads: int,
                           filesystem=None, amp: AmpSetting = "auto"):
    """Batch inference in this process: :class:`BatchPredictor`'s batches over the Parquet ``files``, one at a
    time, with ``threads`` torch threads (restored after). No process starts, so predictions begin as soon as
    the model is loaded."""
    import pyarrow.parquet as pq
    import torch

    previous = torch.get_num_threads()
    try:
        predictor = BatchPredictor(str(checkpoint_dir), use_gpu=False, cpus=threads, amp=amp)
        for path in files:
            parquet = pq.ParquetFile(filesystem.open_input_file(path) if filesystem is not None else path)
            for rows in parquet.iter_batches(batch_size=batch_size, columns=["image", "label", "path"]):
                yield predictor({name: rows.column(name).to_numpy(zero_copy_only=False)
                                 for name in ("image", "label", "path")})
    finally:
        torch.set_num_threads(previous)


def write_prediction_batches(batches, folder: str, filesystem=None) -> None:
    """Write prediction ``batches`` (dicts of columns) as one Parquet file in ``folder``, as Ray Data would."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = f"{folder.rstrip('/')}/part-00000.parquet"
    writer = None
    try:
        for batch in batches:
            table = pa.table({name: pa.array(list(values) if values.dtype == object else values)
                              for name, values in batch.items()})
            if writer is None:
                if filesystem is None:
                    os.makedirs(folder, exist_ok=True)
                writer = pq.ParquetWriter(target, table.schema, filesystem=filesystem)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def in_process_threads(node: NodeCapacity | None) -> int:
    """Torch threads for classifying in the job's own process: the CPUs free on its ``node``, at least one."""
    return max(1, min(node.free_cpus if node else 1, len(os.sched_getaffinity(0))))


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, num_classes: int) -> list[list[int]]:
    """Counts of (true label, predicted label) pairs."""
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    return matrix.tolist()


def run_batch_inference(params: VisionParams, dataset_root: StoragePath | None = None,
                        run_dir: StoragePath | None = None, checkpoint_dir: StoragePath | None = None) -> dict:
    """Classify the validation split with the run's best checkpoint; write predictions and metrics.

    ``dataset_root`` and ``run_dir`` default to the parameters' ``data.output_dir`` and run folder.

    Returns the metrics written to ``inference_metrics.json``. Needs a connected Ray cluster.
    """
    import pyarrow.parquet as pq

    from workloads.vision.inference.confusion import confusion_table, plot_confusion_matrix
    from workloads.vision.reading.torch_dataset import split_files

    cfg: InferConfig = params.infer
    dataset_root = dataset_root if dataset_root is not None else storage.storage_path(params.data.output_dir)
    run_dir = run_dir if run_dir is not None else params.run_dir
    val_files = split_files(dataset_root, "val")
    if checkpoint_dir is None:
        checkpoint_dir, checkpoint_metrics = resolve_checkpoint(run_dir)
        source = f"epoch {int(checkpoint_metrics['epoch'])}, val_accuracy {checkpoint_metrics['val_accuracy']:.4f}"
    else:
        source = "given checkpoint"
    expected_rows = sum(pq.read_metadata(storage.open_input_file(f)).num_rows for f in val_files)
    if expected_rows == 0:
        raise InferenceError(f"the validation split in {dataset_root / 'val'} holds no images: there is nothing to "
                             "classify. Preprocess again with a non-empty split (data.val_fraction, or a source "
                             "with test images), or leave infer out of stages.")
    layout = load_dataset_info(dataset_root).layout
    nodes = cluster_capacity()
    cluster_cpus = sum(node.cpus for node in nodes) or 1.0
    here = ray.get_runtime_context().get_node_id()
    this_node = next((node for node in nodes if node.node_id == here), None)
    node_cpus = this_node.cpus if this_node else cluster_cpus
    in_process = cfg.classifies_in_process(expected_rows, layout.height * layout.width, cluster_cpus / node_cpus)
    started = time.perf_counter()
    files, filesystem = storage.arrow_paths(val_files)
    out_dir = run_dir / PREDICTIONS_DIR
    if in_process:
        threads = in_process_threads(this_node)
        print(f"Batch inference over {dataset_root / 'val'} with {checkpoint_dir} ({source}); in this process "
              f"with {threads} thread(s), batch {cfg.batch_size}: {expected_rows} images of {layout.height} px "
              "take less than starting a pool of actors would (num_actors: auto)", flush=True)
        batches = predictions_in_process(files, checkpoint_dir, cfg.batch_size, threads, filesystem, params.train.amp)
    else:
        actors = actors_for(cfg, expected_rows, cluster_cpus)
        fewer = f" ({expected_rows} images fill {actors} batch(es) of {cfg.batch_size})" if actors < cfg.pool_size(
            cluster_cpus) else ""
        print(f"Batch inference over {dataset_root / 'val'} with {checkpoint_dir} ({source}); "
              f"{actors} actor(s){fewer} x {cfg.cpus_per_actor:g} CPU, batch {cfg.batch_size}", flush=True)
        predictions = prediction_dataset(files, checkpoint_dir, cfg, filesystem=filesystem, amp=params.train.amp,
                                         rows=expected_rows)
    # Old and new predictions are never read back mixed (see storage.replacing_folder).
    with storage.replacing_folder(out_dir) as building:
        path, out_filesystem = storage.arrow_path(building)
        if in_process:
            write_prediction_batches(batches, path, out_filesystem)
        else:
            predictions.write_parquet(path, filesystem=out_filesystem, ray_remote_args={"num_cpus": 0})
        seconds = time.perf_counter() - started
    out_path, filesystem = storage.arrow_path(out_dir)
    table = storage.call_storage(out_dir, lambda: pq.read_table(out_path, filesystem=filesystem,
                                                                columns=PREDICTION_COLUMNS_READ_BACK))
    labels = table.column("label").to_numpy()
    predicted = table.column("predicted_label").to_numpy()
    if len(labels) != expected_rows:
        raise InferenceError(f"inference wrote {len(labels)} predictions for {expected_rows} validation rows")
    classes = load_classes(checkpoint_dir)
    matrix = confusion_matrix(labels, predicted, len(classes))
    correct = int((labels == predicted).sum())
    node_ids = set(table.column("node_id").to_pylist())
    precisions = sorted(set(table.column("precision").to_pylist()))
    metrics = {
        "accuracy": correct / max(1, len(labels)),
        "correct": correct,
        "rows": int(len(labels)),
        "images_per_s": len(labels) / max(1e-9, seconds),
        "seconds": seconds,
        "nodes": len(node_ids),
        "precision": "+".join(precisions),  # each actor chose on its own node: "bf16+fp32" where they differ
        "checkpoint": str(checkpoint_dir),
        "predictions": str(out_dir),
        "classes": classes,
        "confusion_matrix": matrix,
        "per_class_recall": {
            name: (row[i] / sum(row) if sum(row) else None) for i, (name, row) in enumerate(zip(classes, matrix))
        },
    }
    metrics_path = run_dir / METRICS_FILE
    storage.write_text(metrics_path, json.dumps(metrics, indent=2))
    plot_confusion_matrix(matrix, classes, run_dir / CONFUSION_PNG)

    print(confusion_table(matrix, classes), flush=True)
    print(f"Inference accuracy: {metrics['accuracy']:.4f} ({correct}/{len(labels)}), "
          f"{metrics['images_per_s']:.1f} images/s on {nodes_phrase(node_ids)} ({metrics['precision']})", flush=True)
    print(f"Predictions: {out_dir}", flush=True)
    print(f"Confusion matrix: {run_dir / CONFUSION_PNG}; metrics: {metrics_path}", flush=True)
    return metrics
