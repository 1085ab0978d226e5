"""A checkpoint's model at work outside training: loaded once, classifying batches of decoded images or
single image files.

Batch inference (:mod:`workloads.vision.inference.stage`) runs it in a pool of Ray Data
actors; a single image goes through :func:`classify_image_task`, a Ray task that loads the
model and classifies one image, the pattern of Ray's computer-vision tutorial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from workloads import storage
from workloads.storage import StoragePath
from workloads.ray_train.precision import AmpSetting, Precision, choose_precision
from workloads.vision.errors import InferenceError
from workloads.vision.training.model import STATE_FILE, best_checkpoint, model_from_state, read_checkpoint_state


@dataclass
class LoadedModel:
    """A checkpoint's model in eval mode, with what is needed to feed it."""

    model: Any
    classes: list[str]
    layout: Any  # ImageLayout of the images the model was trained on
    device: Any
    precision: Precision = Precision(False, "not chosen")


def load_checkpoint_model(checkpoint_dir: str | StoragePath, use_gpu: bool = False,
                          amp: AmpSetting = "auto") -> LoadedModel:
    """Load the model saved by the training stage in ``checkpoint_dir`` (local or in S3), to run in the
    precision ``amp`` chooses on this machine (see ``train.amp``)."""
    import torch

    if storage.file_size(storage.storage_path(checkpoint_dir) / STATE_FILE) is None:
        raise InferenceError(f"{checkpoint_dir} is not a checkpoint of the training stage (no {STATE_FILE} in it).")
    model, classes, layout = model_from_state(read_checkpoint_state(checkpoint_dir))
    device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
    # channels_last: faster convolutions on GPU and, through oneDNN, on CPU.
    model = model.to(device).eval().to(memory_format=torch.channels_last)
    precision = choose_precision(amp, device.type)
    # The arithmetic the training stage evaluated the checkpoint in, so both report the same predictions.
    return LoadedModel(precision.keep_batch_norm_in_fp32(model, device.type), classes, layout, device, precision)


def load_classes(checkpoint_dir: str | StoragePath) -> list[str]:
    """Class names stored in a checkpoint (without building the model)."""
    return list(read_checkpoint_state(checkpoint_dir, mmap=True)["classes"])


def classify_tensors(loaded: LoadedModel, images) -> tuple[np.ndarray, np.ndarray]:
    """Return (predicted label, softmax probabilities) for a uint8 ``N×C×H×W`` batch of decoded images."""
    import torch

    from workloads.vision.images import normalize

    batch = normalize(images.to(loaded.device, non_blocking=True), loaded.layout, torch.channels_last)
    with torch.inference_mode(), loaded.precision.autocast_context(loaded.device.type):
        logits = loaded.model(batch)
    # numpy has no bf16: the softmax and everything after it are fp32.
    probabilities = torch.softmax(logits.float(), dim=1).cpu().numpy()
    return probabilities.argmax(axis=1), probabilities


def resolve_checkpoint(run_dir: StoragePath) -> tuple[StoragePath, dict]:
    """The best checkpoint of the run in ``run_dir``, or a clear error if it has none."""
    best = best_checkpoint(run_dir)
    if best is None:
        raise InferenceError(
            f"No checkpoint found in {run_dir}: run the train stage for this run_name first "
            "(stages: [train]), or check run_name and storage_path."
        )
    return best


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
        "precision": loaded.precision.name,
    }


@ray.remote(num_cpus=1, num_gpus=0)
def classify_image_task(checkpoint_dir: str, image: bytes, use_gpu: bool = False, top_k: int = 3,
                        stored: bool = False) -> dict:
    """Ray task: load the checkpoint and classify one image. On GPUs, call it as
    ``classify_image_task.options(num_gpus=1).remote(checkpoint_dir, image, use_gpu=True)``."""
    return classify_image_bytes(checkpoint_dir, image, use_gpu=use_gpu, top_k=top_k, stored=stored)
