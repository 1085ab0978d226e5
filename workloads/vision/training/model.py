"""The vision model and its checkpoints: torchvision's ResNet-18 or VisionTransformer, pretrained weights,
and the checkpoint folders a training run keeps.

A checkpoint folder (``<run_dir>/checkpoint_epoch_NNNN/``, on local disk or in S3) holds
``state.pt`` (model, optimizer, scheduler, epoch, config and classes) and ``meta.json``
(the epoch's metrics).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from jobs.infra import ray_internals
from workloads import storage
from workloads.storage import StoragePath
from workloads.ray_train.trainer import TrainingError, first_line
from workloads.vision.config import TrainConfig
from workloads.vision.images import ImageLayout

STATE_FILE = "state.pt"
META_FILE = "meta.json"
# Parameter names of the classification head: new for every dataset, and the part that
# trains alone while ``freeze_epochs`` holds a pretrained backbone.
HEAD_PREFIXES = ("fc.", "heads.")

# torchvision's published ImageNet weights, as torch.hub caches them: <TORCH_HOME>/hub/checkpoints/<file>.
IMAGENET_WEIGHTS_URL = {"resnet18": "https://download.pytorch.org/models/resnet18-f37072fd.pth"}
DOWNLOAD_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- pretrained weights


def imagenet_weights_file(model: str = "resnet18") -> Path:
    """The cached file of the model's ImageNet weights, downloading it first if the cache lacks it.

    One download per machine: concurrent jobs wait on a file lock next to the cache
    entry, and only the driver calls this (workers get the weights through the object store).
    """
    import socket

    import torch.hub
    from filelock import FileLock

    url = IMAGENET_WEIGHTS_URL[model]
    target = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock", timeout=DOWNLOAD_TIMEOUT_S * 20):
        if target.is_file():  # another job fetched it while this one waited
            return target
        # torch.hub's downloader has no timeout of its own; a silent network must not hang the job.
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
        try:
            torch.hub.download_url_to_file(url, str(target), hash_prefix=target.stem.rsplit("-", 1)[-1], progress=False)
        except Exception as exc:  # noqa: BLE001 - offline, proxy, disk: the remedy is the same
            raise TrainingError(
                f"train.weights: imagenet needs torchvision's {model} weights, {target.name}, in torch.hub's cache "
                f"{target.parent} (the folder follows TORCH_HOME), and downloading them from {url} failed "
                f"({type(exc).__name__}: {first_line(exc)}). Without internet on the cluster, pre-seed the cache: on a "
                f"machine with internet run `python -c \"import torchvision; torchvision.models.{model}"
                f"(weights='IMAGENET1K_V1')\"`, then copy ~/.cache/torch/hub/checkpoints/{target.name} to "
                f"{target} on the head node (or set TORCH_HOME in runtime_env.env_vars to a folder holding "
                f"hub/checkpoints/{target.name}). Or use weights: none to train from scratch."
            ) from None
        finally:
            socket.setdefaulttimeout(previous)
    return target


def load_pretrained_state(cfg: TrainConfig) -> dict | None:
    """The state dict named by ``train.weights`` (``None`` for 'none'), read once on the driver.

    Raises :class:`TrainingError` for a missing file, a failed download or a file
    that is not a state dict of the configured model.
    """
    import torch

    if not cfg.fine_tunes:
        return None
    if cfg.uses_imagenet_weights:
        path = imagenet_weights_file(cfg.model)
    else:
        path = Path(cfg.weights).expanduser()
        if not path.is_file():
            raise TrainingError(
                f"train.weights points at {path}, which does not exist. Give the path of a torchvision state dict "
                "of the same model (a .pth file on the node that runs the job's driver; nothing is downloaded), "
                "'imagenet' for torchvision's published weights, or 'none' to start from random weights."
            )
    kind = "ResNet-18" if cfg.model == "resnet18" else "VisionTransformer of the configured shape"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
            state = state["model"]
        fresh_model(cfg, int(state[head_key(cfg)].shape[0]), image_size=state_image_size(cfg, state)).load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - any failure means the same thing to the user
        raise TrainingError(
            f"train.weights {path} is not a torchvision {kind} state dict ({type(exc).__name__}: "
            f"{first_line(exc)})."
        ) from None
    return state


def state_image_size(cfg: TrainConfig, state: dict) -> int:
    """The image side a state dict was trained for: fixed by a ViT's position embeddings; ResNets take any size."""
    if cfg.model != "vit":
        return 224
    tokens = int(state["encoder.pos_embedding"].shape[1]) - 1
    return int(round(tokens ** 0.5)) * cfg.vit.patch_size


# --------------------------------------------------------------------------- building the model


def head_key(cfg: TrainConfig) -> str:
    """The state-dict key of the classification head's weight matrix."""
    return "heads.head.weight" if cfg.model == "vit" else "fc.weight"


def fresh_model(cfg: TrainConfig, num_classes: int, image_size: int):
    """The configured model (torchvision's architecture) with random weights and a ``num_classes``-way head."""
    if cfg.model == "vit":
        from torchvision.models import VisionTransformer

        v = cfg.vit
        return VisionTransformer(image_size=image_size, patch_size=v.patch_size, num_layers=v.num_layers,
                                 num_heads=v.num_heads, hidden_dim=v.hidden_dim, mlp_dim=v.mlp_dim,
                                 dropout=v.dropout, num_classes=num_classes)
    # Not torchvision's own: importing torchvision would add about 2 s to every inference actor's start (resnet.py).
    from workloads.vision.training.resnet import ResNet18

    return ResNet18(num_classes=num_classes, zero_init_residual=cfg.zeroes_residuals())


def build_model(cfg: TrainConfig, num_classes: int, layout: ImageLayout, pretrained: dict | None = None):
    """The configured torchvision model with a ``num_classes``-way head, sized for ``layout``'s images.

    With ``pretrained`` (a state dict from :func:`load_pretrained_state`), everything
    but the head comes from it; a 3-channel stem is summed over colours when the
    images have one channel.
    """
    import torch

    def stem(model):
        return ("conv_proj", model.conv_proj) if cfg.model == "vit" else ("conv1", model.conv1)

    def adapt_stem(model) -> None:
        name, conv = stem(model)
        if conv.in_channels == layout.channels:
            return
        replacement = torch.nn.Conv2d(layout.channels, conv.out_channels, conv.kernel_size, conv.stride,
                                      conv.padding, bias=conv.bias is not None)
        with torch.no_grad():
            # Summing the colour filters keeps a pretrained stem's response to grey images.
            replacement.weight.copy_(conv.weight.sum(dim=1, keepdim=True))
            if conv.bias is not None:
                replacement.bias.copy_(conv.bias)
        setattr(model, name, replacement)

    if pretrained is None:
        model = fresh_model(cfg, num_classes, layout.height)
        adapt_stem(model)
        return model
    model = fresh_model(cfg, int(pretrained[head_key(cfg)].shape[0]), layout.height)
    model.load_state_dict(pretrained)
    adapt_stem(model)
    # The pretrained head predicts its own classes (ImageNet's 1000); ours is trained from scratch.
    if cfg.model == "vit":
        model.heads.head = torch.nn.Linear(model.heads.head.in_features, num_classes)
    else:
        model.fc = torch.nn.Linear(model.fc.in_features, num_classes)
    return model


# --------------------------------------------------------------------------- checkpoints


def checkpoint_state(model, optimizer, scheduler, epoch: int, cfg: TrainConfig, layout: ImageLayout,
                     classes: list[str]) -> dict:
    """What ``state.pt`` holds after epoch index ``epoch`` (0-based); ``model`` unwrapped from DDP."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": epoch,
        "config": {"train": cfg.model_dump(mode="json"), "image_size": layout.height, "layout": layout.to_dict()},
        "classes": list(classes),
    }


def read_checkpoint_state(checkpoint_dir: str | StoragePath, mmap: bool = False) -> dict:
    """The ``state.pt`` of a checkpoint folder, on the CPU (``mmap``: tensors read only when touched, on local disk)."""
    import torch

    state_file = storage.storage_path(checkpoint_dir) / STATE_FILE
    on_disk = storage.local_path(state_file)
    if on_disk is not None:
        return torch.load(on_disk, map_location="cpu", weights_only=False, mmap=mmap)
    return torch.load(io.BytesIO(storage.read_bytes(state_file)), map_location="cpu", weights_only=False)


def model_from_state(state: dict):
    """``(model, classes, layout)`` rebuilt from a checkpoint's state: the trained model (in train mode),
    its class names, and the :class:`ImageLayout` its inputs are normalized with."""
    classes = list(state["classes"])
    config = state.get("config", {})
    layout = ImageLayout.from_manifest(config)
    model = build_model(TrainConfig.model_validate(config.get("train", {})), len(classes), layout)
    model.load_state_dict(state["model"])
    return model, classes, layout


def list_checkpoints(run_dir: StoragePath) -> list[tuple[StoragePath, dict[str, float]]]:
    """The run's kept checkpoints as ``(directory, metrics)``, oldest epoch first (``run_dir`` local or in S3).

    Ray Train's own snapshot of the run is authoritative (it lists only complete,
    kept checkpoints); without one, checkpoint directories with a ``meta.json`` count.
    """
    found: list[tuple[StoragePath, dict[str, float]]] = []
    if storage.file_size(run_dir / ray_internals.checkpoint_snapshot_filename()) is not None:
        for checkpoint, metrics in storage.call_storage(run_dir, lambda: _snapshot_checkpoints(run_dir)):
            path = storage.from_arrow_path(checkpoint.path, run_dir)
            if storage.file_size(path / STATE_FILE) is not None:
                found.append((path, dict(metrics)))
    else:
        for meta in storage.list_files(run_dir, META_FILE, recursive=True):
            if meta.name == META_FILE and storage.file_size(meta.parent / STATE_FILE) is not None:
                found.append((meta.parent, json.loads(storage.read_text(meta))))
    return sorted(found, key=lambda item: item[1].get("epoch", 0))


def _snapshot_checkpoints(run_dir: StoragePath) -> list:
    """``(Checkpoint, metrics)`` pairs of the run's Ray Train snapshot, best first."""
    from ray.train.v2.api.result import Result

    path, filesystem = storage.arrow_path(run_dir)
    # Reading the snapshot makes Ray log advice meant for starting a trainer; here it is only read.
    with ray_internals.quieter(ray_internals.CHECKPOINT_MANAGER_LOGGER):
        result = Result.from_path(path, storage_filesystem=filesystem)
    return list(result.best_checkpoints or [])


def best_checkpoint(run_dir: StoragePath, metric: str = "val_accuracy",
                    mode: str = "max") -> tuple[StoragePath, dict[str, float]] | None:
    """The kept checkpoint best by ``metric`` (highest with ``mode="max"``, lowest with ``"min"``: a sweep's own);
    by default the highest val accuracy, where a lower val loss, then a later epoch, breaks ties."""
    checkpoints = [item for item in list_checkpoints(run_dir) if metric in item[1]]
    if not checkpoints:
        return None
    sign = 1 if mode == "max" else -1
    return max(checkpoints, key=lambda item: (sign * item[1][metric], -item[1].get("val_loss", 0), item[1]["epoch"]))
