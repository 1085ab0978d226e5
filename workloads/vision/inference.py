"""Inference stage: the best checkpoint of a run applied to the validation split.

Batch inference streams the validation Parquet through a pool of Ray Data actors,
each loading the model once. Single images go through a Ray task that loads the
model and classifies one image, the pattern of Ray's computer-vision tutorial.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from jobs import atomic
from workloads import storage
from workloads.placement import nodes_phrase
from workloads.storage import ObjectPath, StoragePath
from workloads.vision.config import InferConfig, VisionParams
from workloads.vision.model import STATE_FILE, best_checkpoint, model_from_state, read_checkpoint_state

PREDICTIONS_DIR = "predictions"
METRICS_FILE = "inference_metrics.json"
CONFUSION_PNG = "confusion_matrix.png"
PREDICTION_COLUMNS_READ_BACK = ["label", "predicted_label", "node_id"]


class InferenceError(RuntimeError):
    """Inference cannot run; the message says why."""


@dataclass
class LoadedModel:
    """A checkpoint's model in eval mode, with what is needed to feed it."""

    model: Any
    classes: list[str]
    layout: Any  # ImageLayout of the images the model was trained on
    device: Any


def load_checkpoint_model(checkpoint_dir: str | StoragePath, use_gpu: bool = False) -> LoadedModel:
    """Load the model saved by the training stage in ``checkpoint_dir`` (local or in S3)."""
    import torch

    if storage.is_remote(checkpoint_dir):
        is_checkpoint = storage.file_size(storage.storage_path(checkpoint_dir) / STATE_FILE) is not None
    else:
        is_checkpoint = (Path(checkpoint_dir) / STATE_FILE).is_file()
    if not is_checkpoint:
        raise InferenceError(f"{checkpoint_dir} is not a checkpoint of the training stage (no {STATE_FILE} in it).")
    model, classes, layout = model_from_state(read_checkpoint_state(checkpoint_dir))
    device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
    # channels_last: faster convolutions on GPU and, through oneDNN, on CPU.
    model = model.to(device).eval().to(memory_format=torch.channels_last)
    return LoadedModel(model, classes, layout, device)


def load_classes(checkpoint_dir: str | StoragePath) -> list[str]:
    """Class names stored in a checkpoint (without building the model)."""
    return list(read_checkpoint_state(checkpoint_dir, mmap=True)["classes"])


def classify_tensors(loaded: LoadedModel, images) -> tuple[np.ndarray, np.ndarray]:
    """Return (predicted label, softmax probabilities) for a uint8 ``N×C×H×W`` batch of decoded images."""
    import torch

    from workloads.vision.images import normalize

    on_gpu = loaded.device.type == "cuda"
    batch = normalize(images.to(loaded.device, non_blocking=True), loaded.layout, torch.channels_last)
    with torch.inference_mode(), torch.autocast(device_type=loaded.device.type, dtype=torch.bfloat16, enabled=on_gpu):
        logits = loaded.model(batch)
    probabilities = torch.softmax(logits.float(), dim=1).cpu().numpy()
    return probabilities.argmax(axis=1), probabilities


class BatchPredictor:
    """Ray Data actor: loads the checkpoint once, then classifies batches of Parquet rows."""

    def __init__(self, checkpoint_dir: str, use_gpu: bool, cpus: float):
        import torch

        # Ray reserved `cpus` for this actor; more threads would fight the other actors.
        torch.set_num_threads(max(1, int(cpus)))
        self.loaded = load_checkpoint_model(checkpoint_dir, use_gpu=use_gpu)
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
        }


def prediction_dataset(files: list[str], checkpoint_dir: str | StoragePath, cfg: InferConfig, filesystem=None):
    """The Ray Data pipeline of batch inference: read Parquet rows, classify them in a pool of model actors.

    ``filesystem``: the ``pyarrow.fs`` filesystem of ``files`` (None: local files).
    """
    from workloads.vision.ingest import read_parquet_on_no_cpu

    # Reads reserve no CPU, so unbounded, Ray would run every read task at once, each in
    # a new worker process that must start and import pyarrow; beside the model actors
    # on a 2-core machine that delayed the first predictions by about 10 s. Two readers
    # keep up with actors that spend far more per row on the model.
    dataset = read_parquet_on_no_cpu(files, columns=["image", "label", "path"], max_concurrent_reads=2,
                                     filesystem=filesystem)
    # Start as many actors as the cluster fits now (the reads take no CPU, so a pool
    # holding every CPU cannot starve them); grow to num_actors if nodes are added.
    resources = ray.cluster_resources()
    fits = resources.get("CPU", 0) // cfg.cpus_per_actor
    if cfg.use_gpu:
        fits = min(fits, resources.get("GPU", 0))
    start_with = int(max(1, min(cfg.num_actors, fits)))
    return dataset.map_batches(
        BatchPredictor,
        fn_constructor_kwargs={"checkpoint_dir": str(checkpoint_dir), "use_gpu": cfg.use_gpu,
                               "cpus": cfg.cpus_per_actor},
        batch_size=cfg.batch_size,
        compute=ray.data.ActorPoolStrategy(min_size=start_with, max_size=cfg.num_actors),
        num_cpus=cfg.cpus_per_actor,
        num_gpus=1 if cfg.use_gpu else 0,
        batch_format="numpy",
    )


def resolve_checkpoint(run_dir: StoragePath) -> tuple[StoragePath, dict]:
    """The best checkpoint of the run in ``run_dir``, or a clear error if it has none."""
    best = best_checkpoint(run_dir)
    if best is None:
        raise InferenceError(
            f"No checkpoint found in {run_dir}: run the train stage for this run_name first "
            "(stages: [train]), or check run_name and storage_path."
        )
    return best


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, num_classes: int) -> list[list[int]]:
    """Counts of (true label, predicted label) pairs."""
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    return matrix.tolist()


def run_batch_inference(params: VisionParams, dataset_root: StoragePath | None = None,
                        run_dir: StoragePath | None = None, checkpoint_dir: StoragePath | None = None) -> dict:
    """Classify the validation split with the run's best checkpoint; write predictions and metrics.

    Returns the metrics written to ``inference_metrics.json``. Needs a connected Ray cluster.
    """
    import pyarrow.parquet as pq

    from workloads.vision.dataset import split_files
    from workloads.vision.plots import confusion_table, plot_confusion_matrix

    cfg: InferConfig = params.infer
    dataset_root = _as_location(dataset_root or params.data.output_dir)
    run_dir = _as_location(run_dir or params.run_dir)
    val_files = split_files(dataset_root, "val")
    if checkpoint_dir is None:
        checkpoint_dir, checkpoint_metrics = resolve_checkpoint(run_dir)
        source = f"epoch {int(checkpoint_metrics['epoch'])}, val_accuracy {checkpoint_metrics['val_accuracy']:.4f}"
    else:
        source = "given checkpoint"
    print(f"Batch inference over {dataset_root / 'val'} with {checkpoint_dir} ({source}); "
          f"{cfg.num_actors} actor(s) x {cfg.cpus_per_actor:g} CPU, batch {cfg.batch_size}", flush=True)
    expected_rows = sum(pq.read_metadata(storage.open_input_file(f)).num_rows for f in val_files)

    started = time.perf_counter()
    files, filesystem = storage.reader_paths(val_files)
    predictions = prediction_dataset(files, checkpoint_dir, cfg, filesystem=filesystem)
    out_dir = run_dir / PREDICTIONS_DIR
    if isinstance(out_dir, ObjectPath):
        # No rename in S3: the old predictions go first, so no mix of old and new files is read back.
        storage.delete_tree(out_dir)
        filesystem, out_path = storage.filesystem_and_path(out_dir)
        predictions.write_parquet(out_path, filesystem=filesystem, ray_remote_args={"num_cpus": 0})
        seconds = time.perf_counter() - started
        table = storage.call_storage(out_dir, lambda: pq.read_table(out_path, filesystem=filesystem,
                                                                    columns=PREDICTION_COLUMNS_READ_BACK))
    else:
        seconds = _write_predictions_locally(predictions, run_dir, started)
        table = pq.read_table(out_dir, columns=PREDICTION_COLUMNS_READ_BACK)
    labels = table.column("label").to_numpy()
    predicted = table.column("predicted_label").to_numpy()
    if len(labels) != expected_rows:
        raise InferenceError(f"inference wrote {len(labels)} predictions for {expected_rows} validation rows")
    classes = load_classes(checkpoint_dir)
    matrix = confusion_matrix(labels, predicted, len(classes))
    correct = int((labels == predicted).sum())
    node_ids = set(table.column("node_id").to_pylist())
    metrics = {
        "accuracy": correct / max(1, len(labels)),
        "correct": correct,
        "rows": int(len(labels)),
        "images_per_s": len(labels) / max(1e-9, seconds),
        "seconds": seconds,
        "nodes": len(node_ids),
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
          f"{metrics['images_per_s']:.1f} images/s on {nodes_phrase(node_ids)}", flush=True)
    print(f"Predictions: {out_dir}", flush=True)
    print(f"Confusion matrix: {run_dir / CONFUSION_PNG}; metrics: {metrics_path}", flush=True)
    return metrics


def _as_location(value: str | StoragePath) -> StoragePath:
    return storage.storage_path(value) if storage.is_remote(value) else Path(value)


def _write_predictions_locally(predictions, run_dir: Path, started: float) -> float:
    """Write the predictions to ``run_dir/predictions`` (replacing the old ones at once); return the seconds taken
    since ``started``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic.recover_dir(run_dir / PREDICTIONS_DIR)
    staged = atomic.staging_dir(run_dir / PREDICTIONS_DIR)
    try:
        predictions.write_parquet(str(staged), ray_remote_args={"num_cpus": 0})
        seconds = time.perf_counter() - started
        atomic.replace_dir(staged, run_dir / PREDICTIONS_DIR)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return seconds


# --------------------------------------------------------------------------- single images


def classify_image_bytes(checkpoint_dir: str | StoragePath, image: bytes, use_gpu: bool = False, top_k: int = 3,
                         stored: bool = False) -> dict:
    """Load the checkpoint and classify one image: an encoded file (JPEG, PNG, ...), or with
    ``stored`` the ``image`` cell of a row of the preprocessed dataset."""
    import torch

    from workloads.vision.images import decode_one, fit_external_image

    loaded = load_checkpoint_model(checkpoint_dir, use_gpu=use_gpu)
    try:
        pixels = decode_one(image, loaded.layout) if stored else fit_external_image(image, loaded.layout)
    except Exception as exc:  # noqa: BLE001 - PIL raises several types for undecodable input
        raise InferenceError(f"cannot decode the image ({type(exc).__name__}: {exc})") from None
    predicted, probabilities = classify_tensors(loaded, torch.from_numpy(pixels).permute(2, 0, 1)[None])
    ranked = np.argsort(-probabilities[0])[:top_k]
    return {
        "predicted_label": int(predicted[0]),
        "predicted_class": loaded.classes[int(predicted[0])],
        "confidence": float(probabilities[0, predicted[0]]),
        "top": [(loaded.classes[int(i)], float(probabilities[0, i])) for i in ranked],
    }


@ray.remote(num_cpus=1, num_gpus=0)
def classify_image_task(checkpoint_dir: str, image: bytes, use_gpu: bool = False, top_k: int = 3,
                        stored: bool = False) -> dict:
    """Ray task: load the checkpoint and classify one image. On GPUs, call it as
    ``classify_image_task.options(num_gpus=1).remote(checkpoint_dir, image, use_gpu=True)``."""
    return classify_image_bytes(checkpoint_dir, image, use_gpu=use_gpu, top_k=top_k, stored=stored)
