"""Training stage: ResNet-18 on the Parquet dataset with Ray Train's TorchTrainer.

Layout of a run, ``<storage_path>/<run_name>/``:

- ``checkpoint_epoch_NNNN/`` (kept by Ray Train, best ``num_to_keep`` by val accuracy,
  plus the latest): ``state.pt`` with model, optimizer, scheduler, epoch (0-based
  index of the last finished epoch), config and classes; ``meta.json`` with the
  epoch's metrics.
- ``metrics.csv``: one row per finished epoch, written by rank 0 after every epoch.
- ``loss_curve.png``: drawn by the driver from ``metrics.csv``.

Running again with the same run name continues after the latest checkpoint: Ray
Train V2 (the default in Ray 2.60) finds the run's checkpoint snapshot under the
same ``RunConfig(name, storage_path)`` and hands its latest checkpoint to
``ray.train.get_checkpoint()``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.raytrain import first_line, root_cause, run_config
from workloads.vision.config import TrainConfig, VisionParams
from workloads.vision.images import ImageLayout
from workloads.vision.plots import LOSS_CURVE, METRICS_CSV, plot_loss_curve, read_metrics_csv, write_metrics_csv

if TYPE_CHECKING:
    from workloads.vision.preprocess import DatasetInfo

# data_wait_s: seconds per worker blocked waiting for the next batch; compute_s: the
# rest of the training pass (forward, backward, optimizer step).
METRIC_FIELDS = ["epoch", "train_loss", "val_loss", "val_accuracy", "images_per_s", "epoch_s", "data_wait_s",
                 "compute_s", "lr"]
STATE_FILE = "state.pt"
META_FILE = "meta.json"
# Test hook: makes rank 1 exit once at the start of this epoch index, to exercise recovery.
FAIL_AT_EPOCH_ENV_VAR = "RAYJOBS_TEST_FAIL_AT_EPOCH"
SECONDS_BETWEEN_PROGRESS_LINES = 30.0


class TrainingError(RuntimeError):
    """Training cannot start or did not finish; the message says why."""


@dataclass
class TrainingOutcome:
    """What a training stage left behind."""

    run_dir: Path
    best_checkpoint: Path | None
    best_metrics: dict[str, float]
    final_metrics: dict[str, float]
    metrics_csv: Path
    loss_curve: Path | None
    epochs_trained: list[int] = field(default_factory=list)  # epoch numbers (1-based) this call trained
    skipped: bool = False


# --------------------------------------------------------------------------- model


# torchvision's published ImageNet weights, as torch.hub caches them: <TORCH_HOME>/hub/checkpoints/<file>.
IMAGENET_WEIGHTS_URL = {"resnet18": "https://download.pytorch.org/models/resnet18-f37072fd.pth"}
DOWNLOAD_TIMEOUT_S = 60.0


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
        head_key = "heads.head.weight" if cfg.model == "vit" else "fc.weight"
        _fresh_model(cfg, int(state[head_key].shape[0]), image_size=_state_image_size(cfg, state)).load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - any failure means the same thing to the user
        raise TrainingError(
            f"train.weights {path} is not a torchvision {kind} state dict ({type(exc).__name__}: "
            f"{first_line(exc)})."
        ) from None
    return state


def _state_image_size(cfg: TrainConfig, state: dict) -> int:
    # A ViT's position embeddings fix its image size; ResNets take any size.
    if cfg.model != "vit":
        return 224
    tokens = int(state["encoder.pos_embedding"].shape[1]) - 1
    return int(round(tokens ** 0.5)) * cfg.vit.patch_size


def _fresh_model(cfg: TrainConfig, num_classes: int, image_size: int):
    from torchvision.models import VisionTransformer, resnet18

    if cfg.model == "vit":
        v = cfg.vit
        return VisionTransformer(image_size=image_size, patch_size=v.patch_size, num_layers=v.num_layers,
                                 num_heads=v.num_heads, hidden_dim=v.hidden_dim, mlp_dim=v.mlp_dim,
                                 dropout=v.dropout, num_classes=num_classes)
    # Zero-initialized last BatchNorm of each residual block: every block starts as the
    # identity, which keeps the first steps from scratch stable (Goyal et al., 2017).
    return resnet18(weights=None, num_classes=num_classes, zero_init_residual=True)


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
        model = _fresh_model(cfg, num_classes, layout.height)
        adapt_stem(model)
        return model
    head_key = "heads.head.weight" if cfg.model == "vit" else "fc.weight"
    model = _fresh_model(cfg, int(pretrained[head_key].shape[0]), layout.height)
    model.load_state_dict(pretrained)
    adapt_stem(model)
    # The pretrained head predicts its own classes (ImageNet's 1000); ours is trained from scratch.
    if cfg.model == "vit":
        model.heads.head = torch.nn.Linear(model.heads.head.in_features, num_classes)
    else:
        model.fc = torch.nn.Linear(model.fc.in_features, num_classes)
    return model


HEAD_PREFIXES = ("fc.", "heads.")
HEAD_WEIGHTS_GROUP = 2  # index of the head's weights among make_optimizer's parameter groups


def make_optimizer(model, cfg: TrainConfig):
    """AdamW or SGD with Nesterov momentum at ``cfg.peak_lr()``.

    Four parameter groups, in this order: backbone weights, backbone biases and norms,
    head weights, head biases and norms. Biases and norms get no weight decay, and
    the head's groups are the ones that train while ``freeze_epochs`` holds the backbone.
    """
    import torch

    groups = [[], [], [], []]
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            head = name.startswith(HEAD_PREFIXES)
            groups[2 * head + (parameter.ndim <= 1)].append(parameter)
    decay = cfg.decay()
    param_groups = [{"params": params, "weight_decay": decay if index % 2 == 0 else 0.0}
                    for index, params in enumerate(groups)]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(param_groups, lr=cfg.peak_lr())
    return torch.optim.SGD(param_groups, lr=cfg.peak_lr(), momentum=cfg.momentum, nesterov=cfg.momentum > 0)


def lr_factor(step: int, steps_per_epoch: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak learning rate at optimizer ``step`` (linear warm-up, then the schedule)."""
    total = max(1, cfg.epochs * steps_per_epoch)
    # Warm-up is counted in steps: with a few dozen steps per epoch, whole epochs would be too coarse.
    warmup = min(int(round(cfg.warmup() * steps_per_epoch)), total - 1)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step - warmup) / max(1, total - warmup)
    if cfg.lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    if cfg.lr_schedule == "step":
        # The classic recipe: divide by 10 at half and at three quarters of training.
        return 0.1 ** ((progress >= 0.5) + (progress >= 0.75))
    return 1.0


def make_scheduler(optimizer, cfg: TrainConfig, steps_per_epoch: int):
    """A per-step ``LambdaLR`` following :func:`lr_factor`; the backbone's groups stay at zero while frozen."""
    import torch

    frozen_steps = cfg.freeze_epochs * steps_per_epoch if cfg.fine_tunes else 0

    def backbone(step: int) -> float:
        return 0.0 if step < frozen_steps else lr_factor(step, steps_per_epoch, cfg)

    def head(step: int) -> float:
        return lr_factor(step, steps_per_epoch, cfg)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [backbone, backbone, head, head])


def epoch_warning(metrics: dict[str, float], num_classes: int) -> str:
    """A warning for an epoch whose validation loss exploded while accuracy sits at chance, else ''."""
    chance_loss = math.log(num_classes)
    chance_accuracy = 1.0 / num_classes
    if metrics["val_loss"] > 3 * chance_loss and metrics["val_accuracy"] < 1.5 * chance_accuracy:
        return (f" WARNING: validation loss {metrics['val_loss']:.4g} is over 3x that of a uniform guess "
                f"({chance_loss:.2f}) and accuracy is at chance ({chance_accuracy:.2f}): training is unstable. "
                "If it persists, lower train.lr or train.batch_size, or lengthen train.warmup_epochs.")
    return ""


class Diverged(Exception):
    """The loss or the gradients stopped being finite."""


class DivergenceGuard:
    """Finds the first optimizer step whose gradient norm (or loss) is not finite.

    DDP averages gradients across ranks, so a non-finite gradient norm shows on every
    rank at the same step: the ranks agree to stop without exchanging a message. On
    an accelerator the flag stays on the device and is read every ``check_every``
    steps, so the loop does not wait for the device on each step.
    """

    def __init__(self, device, check_every: int):
        import torch

        self.check_every = max(1, check_every)
        self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=device)
        self.bad_loss = torch.zeros((), dtype=torch.float64, device=device)

    def observe(self, step: int, loss, grad_norm) -> None:
        """Record step ``step``; raise :class:`Diverged` once a recorded step was not finite."""
        import torch

        ok = torch.isfinite(grad_norm) & torch.isfinite(loss)
        first = (self.first_bad_step < 0) & ~ok
        self.first_bad_step = torch.where(first, step, self.first_bad_step)
        self.bad_loss = torch.where(first, loss.detach().double(), self.bad_loss)
        if (step + 1) % self.check_every == 0:
            self.check()

    def check(self) -> None:
        """Raise :class:`Diverged` if any observed step was not finite."""
        bad = int(self.first_bad_step.item())
        if bad >= 0:
            raise Diverged(bad, float(self.bad_loss.item()))


# --------------------------------------------------------------------------- worker loop


def _read_metric_rows(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    return read_metrics_csv(path)


def _say(message: str) -> None:
    # Ray Train V2 reroutes print() in workers through logging and echoes it too,
    # which doubles every line; writing to stdout directly keeps one copy.
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _unwrap(model):
    return getattr(model, "module", model)


def _maybe_fail_for_test(config: dict, epoch: int, rank: int) -> None:
    fail_at = config.get("fail_at_epoch")
    if fail_at is None or epoch != fail_at or rank != min(1, config["world_size"] - 1):
        return
    marker = Path(config["fail_marker"])
    if marker.exists():
        return
    # The controller collects reports every couple of seconds; a worker dying right
    # after a report can lose that report's checkpoint. Wait until the previous
    # epoch's checkpoint is registered, so the failure exercises recovery from it.
    snapshot = Path(config["run_dir"]) / "checkpoint_manager_snapshot.json"
    previous = f"checkpoint_epoch_{epoch:04d}"
    deadline = time.monotonic() + 60
    while epoch > 0 and time.monotonic() < deadline:
        if snapshot.exists() and previous in snapshot.read_text(encoding="utf-8"):
            break
        time.sleep(0.2)
    marker.write_text(f"worker of rank {rank} exited at epoch index {epoch}\n", encoding="utf-8")
    _say(f"[test hook] rank {rank} exits at the start of epoch index {epoch}")
    os._exit(1)


def effective_loader_workers(cfg: TrainConfig) -> int:
    """DataLoader processes per training worker: ``loader_workers``, but never more than the CPUs reserved beside
    the training process itself.

    On 2 cores with 2 one-CPU workers, two loader processes each made six busy
    processes; DDP's all-reduce then waited on whichever rank was descheduled, and
    training ran at 66-80 images/s instead of 114-119 with decoding done inline.
    """
    if cfg.use_gpu:
        return cfg.loader_workers  # the GPU does the model's work; the reserved CPUs are the loader's
    return min(cfg.loader_workers, max(0, int(cfg.cpus_per_worker) - 1))


class _TorchBatches:
    """``ingest: torch``: Parquet row groups through a DataLoader prepared by Ray Train."""

    def __init__(self, config: dict, cfg: TrainConfig, layout: ImageLayout, rank: int, world_size: int, on_gpu: bool):
        import ray.train.torch
        from torch.utils.data import DataLoader

        from workloads.vision.dataset import AugmentingCollate, GroupedShardSampler, ParquetImageDataset, split_files

        dataset_root = Path(config["dataset_root"])
        per_worker_batch = max(1, cfg.batch_size // world_size)
        train_set = ParquetImageDataset(split_files(dataset_root, "train"), layout)
        val_set = ParquetImageDataset(split_files(dataset_root, "val"), layout)
        self.train_sampler = GroupedShardSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                                 seed=cfg.seed, pad=True)
        # Unpadded shards: each validation row is seen by exactly one rank, so the
        # summed counts are the exact full-split figures.
        val_sampler = GroupedShardSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False, pad=False)
        loader_workers = effective_loader_workers(cfg)
        options: dict[str, Any] = {"num_workers": loader_workers, "pin_memory": on_gpu}
        if loader_workers > 0:
            options["persistent_workers"] = True
        augment = layout.resolve_augment(cfg.augment)
        self.train_loader = ray.train.torch.prepare_data_loader(DataLoader(
            train_set, batch_size=per_worker_batch, sampler=self.train_sampler, drop_last=False,
            collate_fn=AugmentingCollate(augment), **options))
        self.val_loader = ray.train.torch.prepare_data_loader(DataLoader(
            val_set, batch_size=per_worker_batch, sampler=val_sampler, collate_fn=AugmentingCollate("none"), **options))
        self.steps_per_epoch = len(self.train_loader)
        self.world_size = world_size

    def train_epoch(self, epoch: int):
        if self.world_size > 1:
            self.train_loader.sampler.set_epoch(epoch)
        return iter(self.train_loader)

    def val_batches(self):
        return iter(self.val_loader)


class _RayDataBatches:
    """``ingest: ray_data``: this worker's shards of the Ray Datasets given to the trainer."""

    def __init__(self, config: dict, cfg: TrainConfig, world_size: int, device):
        import ray.train
        import torch

        self.per_worker_batch = max(1, cfg.batch_size // world_size)
        self.prefetch = cfg.prefetch_batches
        self.device = device
        self.train_shard = ray.train.get_dataset_shard("train")
        self.val_shard = ray.train.get_dataset_shard("val")
        self.dtypes = {"image": torch.uint8, "label": torch.int64}
        # The trainer splits the train set into equal shares, so every rank runs the same number of steps.
        self.steps_per_epoch = max(1, math.ceil((config["train_rows"] // world_size) / self.per_worker_batch))

    def _batches(self, shard, shuffle: bool):
        for batch in shard.iter_torch_batches(
            batch_size=self.per_worker_batch, dtypes=self.dtypes, device=self.device,
            prefetch_batches=self.prefetch, drop_last=False,
            # Blocks arrive in a new order every epoch; the buffer mixes rows across them.
            local_shuffle_buffer_size=4 * self.per_worker_batch if shuffle else None,
        ):
            yield batch["image"], batch["label"]

    def train_epoch(self, epoch: int):
        return self._batches(self.train_shard, shuffle=True)

    def val_batches(self):
        return self._batches(self.val_shard, shuffle=False)


def _diverged(diverged: Diverged, epoch: int, steps_per_epoch: int, cfg: TrainConfig, rank: int) -> dict:
    """What every rank returns when training diverged; rank 0 says so in the log."""
    step, loss = diverged.args  # step: index within the epoch
    report = {"epoch": epoch + 1, "step": step + 1, "steps_per_epoch": steps_per_epoch, "loss": loss,
              "lr": cfg.peak_lr(), "batch_size": cfg.batch_size}
    if rank == 0:
        _say(f"epoch {epoch + 1}/{cfg.epochs} step {step + 1}: loss {loss:.4g}, gradients not finite; stopping")
    return {"diverged": report}


def train_loop_per_worker(config: dict) -> dict:
    """Body of every Ray Train worker: train, evaluate, checkpoint and report each epoch.

    Returns (from rank 0, as ``Result.return_value``) the epoch numbers this attempt trained.
    """
    import torch
    import torch.distributed as dist
    import ray.train
    import ray.train.torch

    from workloads.vision.images import normalize

    cfg = TrainConfig.model_validate(config["train"])
    classes: list[str] = config["classes"]
    layout = ImageLayout.from_manifest({"layout": config["layout"]})
    if cfg.fine_tunes:
        # Pretrained weights expect the inputs they were trained on; the checkpoint keeps
        # this layout, so inference normalizes the same way.
        layout = layout.with_imagenet_statistics()
    run_dir = Path(config["run_dir"])

    # One intra-op thread per reserved CPU: Ray reserved cpus_per_worker for this
    # process, and more threads would contend with the other workers on the node.
    torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    config["world_size"] = world_size
    torch.manual_seed(cfg.seed + rank)
    device = ray.train.torch.get_device()
    on_gpu = device.type == "cuda"
    use_amp = on_gpu and cfg.amp
    memory_format = torch.channels_last if (on_gpu and cfg.channels_last) else torch.contiguous_format

    if cfg.ingest == "ray_data":
        batches = _RayDataBatches(config, cfg, world_size, device)
    else:
        batches = _TorchBatches(config, cfg, layout, rank, world_size, on_gpu)

    pretrained = ray.get(config["pretrained"]) if config.get("pretrained") is not None else None
    model = build_model(cfg, len(classes), layout, pretrained)
    del pretrained
    model = model.to(memory_format=memory_format)
    # Gradients that live in DDP's communication buckets skip one copy of every gradient per step.
    model = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"gradient_as_bucket_view": True})
    optimizer = make_optimizer(_unwrap(model), cfg)
    steps_per_epoch = max(1, batches.steps_per_epoch)
    scheduler = make_scheduler(optimizer, cfg, steps_per_epoch)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    # Reading a flag from an accelerator waits for it; on the CPU the check is free.
    guard = DivergenceGuard(device, check_every=1 if device.type == "cpu" else 25)

    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and config.get("resume_from"):
        checkpoint = ray.train.Checkpoint.from_directory(config["resume_from"])
    if checkpoint is not None:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(Path(checkpoint_dir) / STATE_FILE, map_location="cpu", weights_only=False)
        if list(state["classes"]) != list(classes):
            raise TrainingError(
                f"the checkpoint of run {run_dir.name!r} was trained on classes {state['classes']}, "
                f"but the dataset has {classes}; use a new run_name"
            )
        _unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch = int(state["epoch"]) + 1
        # The optimizer's saved learning rate follows the old schedule; when train.epochs
        # grew, the schedule stretched, so recompute the rate for the step we resume at.
        for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base_lr * factor(scheduler.last_epoch)
        if rank == 0:
            _say(f"Resuming run {run_dir.name!r} after epoch {start_epoch} from {checkpoint.path}")

    metrics_csv = run_dir / METRICS_CSV
    history = [r for r in _read_metric_rows(metrics_csv) if r["epoch"] <= start_epoch] if rank == 0 else []

    def all_reduce(values: list[float], op=None) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        if world_size > 1:
            dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
        return tensor.tolist()

    trained: list[int] = []
    for epoch in range(start_epoch, cfg.epochs):
        _maybe_fail_for_test(config, epoch, rank)
        model.train()
        lr = optimizer.param_groups[HEAD_WEIGHTS_GROUP]["lr"]  # the backbone's is zero while it is frozen
        # Summed on the device so the loop never waits for the accelerator to report a number.
        loss_total = torch.zeros((), dtype=torch.float64, device=device)
        seen = 0.0
        data_wait = 0.0
        epoch_start = last_progress = time.perf_counter()
        train_batches = batches.train_epoch(epoch)
        step = 0
        while True:
            wait_start = time.perf_counter()
            try:
                images, labels = next(train_batches)
            except StopIteration:
                break
            data_wait += time.perf_counter() - wait_start
            images = normalize(images, layout, memory_format)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
                logits = model(images)
                loss = loss_fn(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # Also the divergence check: DDP has averaged the gradients, so every rank sees the same norm.
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip_norm or math.inf)
            try:
                guard.observe(step, loss, grad_norm)
            except Diverged as diverged:
                return _diverged(diverged, epoch, steps_per_epoch, cfg, rank)
            optimizer.step()
            scheduler.step()
            batch = labels.shape[0]
            loss_total += loss.detach().double() * batch
            seen += batch
            step += 1
            now = time.perf_counter()
            if rank == 0 and now - last_progress >= SECONDS_BETWEEN_PROGRESS_LINES:
                last_progress = now
                _say(f"  epoch {epoch + 1}/{cfg.epochs} step {step}/{steps_per_epoch} "
                      f"loss {loss_total.item() / seen:.4f} ({seen * world_size / (now - epoch_start):.1f} images/s)")
        try:
            guard.check()
        except Diverged as diverged:
            return _diverged(diverged, epoch, steps_per_epoch, cfg, rank)
        loss_sum = loss_total.item()
        train_seconds = time.perf_counter() - epoch_start

        val_loss_sum = val_correct = val_seen = 0.0
        evaluated = _unwrap(model)
        if world_size > 1:
            # DDP hands rank 0's batch-norm statistics to the others before each forward
            # pass, and each rank then updates them with its own last batch. Taking rank
            # 0's (the ones saved in the checkpoint) makes every rank evaluate the same model.
            for buffer in evaluated.buffers():
                dist.broadcast(buffer, src=0)
        evaluated.eval()
        with torch.no_grad():
            for images, labels in batches.val_batches():
                images = normalize(images, layout, memory_format)
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
                    logits = evaluated(images)
                logits = logits.float()
                val_loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
                val_correct += (logits.argmax(dim=1) == labels).sum().item()
                val_seen += labels.shape[0]
        epoch_seconds = time.perf_counter() - epoch_start

        compute = train_seconds - data_wait
        loss_sum, seen, val_loss_sum, val_correct, val_seen, data_wait, compute = all_reduce(
            [loss_sum, seen, val_loss_sum, val_correct, val_seen, data_wait, compute])
        (train_seconds, epoch_seconds) = all_reduce([train_seconds, epoch_seconds], dist.ReduceOp.MAX if world_size > 1 else None)
        metrics = {
            "epoch": epoch + 1,
            "train_loss": loss_sum / max(1.0, seen),
            "val_loss": val_loss_sum / max(1.0, val_seen),
            "val_accuracy": val_correct / max(1.0, val_seen),
            "val_correct": int(val_correct),
            "val_rows": int(val_seen),
            "images_per_s": seen / max(1e-9, train_seconds),
            "epoch_s": epoch_seconds,
            "data_wait_s": data_wait / world_size,
            "compute_s": compute / world_size,
            "lr": lr,
        }

        with tempfile.TemporaryDirectory(prefix="rayjobs-ckpt-") as tmp:
            report_checkpoint = None
            if rank == 0:
                history = [r for r in history if r["epoch"] < epoch + 1] + [metrics]
                write_metrics_csv(metrics_csv, history, METRIC_FIELDS)
                torch.save({
                    "model": _unwrap(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "epoch": epoch,
                    "config": {"train": cfg.model_dump(mode="json"), "image_size": layout.height,
                               "layout": layout.to_dict()},
                    "classes": list(classes),
                }, Path(tmp) / STATE_FILE)
                (Path(tmp) / META_FILE).write_text(json.dumps(metrics, indent=2), encoding="utf-8")
                report_checkpoint = ray.train.Checkpoint.from_directory(tmp)
                _say(f"epoch {epoch + 1}/{cfg.epochs}: train_loss {metrics['train_loss']:.4f} "
                      f"val_loss {metrics['val_loss']:.4f} val_accuracy {metrics['val_accuracy']:.4f} "
                      f"({metrics['images_per_s']:.1f} images/s, {epoch_seconds:.1f}s, "
                      f"data wait {metrics['data_wait_s']:.1f}s, compute {metrics['compute_s']:.1f}s)"
                      + epoch_warning(metrics, len(classes)))
            ray.train.report(metrics, checkpoint=report_checkpoint, checkpoint_dir_name=f"checkpoint_epoch_{epoch + 1:04d}")
        trained.append(epoch + 1)
    return {"start_epoch": start_epoch, "epochs_trained": trained}


# --------------------------------------------------------------------------- driver


def _train_v2_enabled() -> bool:
    from ray.train.v2._internal.constants import is_v2_enabled

    return is_v2_enabled()


def list_checkpoints(run_dir: Path) -> list[tuple[Path, dict[str, float]]]:
    """The run's kept checkpoints as ``(directory, metrics)``, oldest epoch first.

    Ray Train's own snapshot of the run is authoritative (it lists only complete,
    kept checkpoints); without one, checkpoint directories with a ``meta.json`` count.
    """
    run_dir = Path(run_dir)
    found: list[tuple[Path, dict[str, float]]] = []
    if not run_dir.is_dir():
        return found
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    if (run_dir / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).exists():
        import logging

        from ray.train.v2.api.result import Result

        # Reading the snapshot makes Ray log advice meant for starting a trainer; here it is only read.
        manager_logger = logging.getLogger("ray.train.v2._internal.execution.checkpoint.checkpoint_manager")
        level = manager_logger.level
        manager_logger.setLevel(logging.WARNING)
        try:
            result = Result.from_path(str(run_dir))
        finally:
            manager_logger.setLevel(level)
        for checkpoint, metrics in result.best_checkpoints or []:
            path = Path(checkpoint.path)
            if (path / STATE_FILE).exists():
                found.append((path, dict(metrics)))
    else:
        for meta in run_dir.rglob(META_FILE):
            if (meta.parent / STATE_FILE).exists():
                found.append((meta.parent, json.loads(meta.read_text(encoding="utf-8"))))
    return sorted(found, key=lambda item: item[1].get("epoch", 0))


def best_checkpoint(run_dir: Path) -> tuple[Path, dict[str, float]] | None:
    """The kept checkpoint with the highest val accuracy (lower val loss, then later epoch, breaks ties)."""
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return None
    return max(checkpoints, key=lambda item: (item[1]["val_accuracy"], -item[1]["val_loss"], item[1]["epoch"]))


def outcome_from_disk(run_dir: Path, trained: list[int], skipped: bool) -> TrainingOutcome:
    """Describe a run from what is on disk: its metrics, curve and best checkpoint."""
    metrics_csv = run_dir / METRICS_CSV
    rows = _read_metric_rows(metrics_csv)
    loss_curve = plot_loss_curve(metrics_csv, run_dir / LOSS_CURVE) if rows else None
    best = best_checkpoint(run_dir)
    return TrainingOutcome(
        run_dir=run_dir,
        best_checkpoint=best[0] if best else None,
        best_metrics=best[1] if best else {},
        final_metrics=rows[-1] if rows else {},
        metrics_csv=metrics_csv,
        loss_curve=loss_curve,
        epochs_trained=trained,
        skipped=skipped,
    )


def run_training(params: VisionParams, info: DatasetInfo) -> TrainingOutcome:
    """Train (or continue training) ``params.run_name`` on the preprocessed dataset ``info`` describes.

    Needs a connected Ray cluster. Raises :class:`TrainingError` with a readable
    message for problems the user can fix.
    """
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from workloads.vision.dataset import split_files

    cfg = params.train
    dataset_root, classes, layout = Path(info.root), info.classes, info.layout
    split_files(dataset_root, "train")
    split_files(dataset_root, "val")
    if cfg.model == "vit" and layout.height % cfg.vit.patch_size:
        raise TrainingError(f"train.vit.patch_size {cfg.vit.patch_size} does not divide the dataset's "
                            f"{layout.height}-pixel images")
    # Read once here, checked, and handed to every worker through the object store: the
    # workers' nodes need neither the file nor internet access.
    pretrained = load_pretrained_state(cfg)
    if pretrained is not None:
        print(f"Fine-tuning from {'ImageNet weights' if cfg.uses_imagenet_weights else cfg.weights}: peak lr "
              f"{cfg.peak_lr():.3g}" + (f", backbone frozen for {cfg.freeze_epochs} epoch(s)" if cfg.freeze_epochs else ""),
              flush=True)
    run_dir = Path(params.storage_path).expanduser().resolve() / params.run_name

    checkpoints = list_checkpoints(run_dir)
    latest = checkpoints[-1] if checkpoints else None
    if latest is not None:
        done = int(latest[1]["epoch"])
        if done >= cfg.epochs:
            print(f"Run {params.run_name!r} already finished {done} of {cfg.epochs} epochs "
                  f"(latest checkpoint {latest[0]}); nothing to train. Raise train.epochs to train further, "
                  "or pick a new run_name to start over.", flush=True)
            return outcome_from_disk(run_dir, [], skipped=True)
        print(f"Run {params.run_name!r} has a checkpoint after epoch {done}: continuing with epoch {done + 1} "
              f"of {cfg.epochs}.", flush=True)

    resources = {"CPU": float(cfg.cpus_per_worker), **cfg.resources_per_worker}
    if cfg.use_gpu:
        resources.setdefault("GPU", 1.0)
    fail_at = os.environ.get(FAIL_AT_EPOCH_ENV_VAR)
    loop_config = {
        "train": cfg.model_dump(mode="json"),
        "classes": list(classes),
        "layout": layout.to_dict(),
        "train_rows": int(info.counts.get("train", 0)),
        "dataset_root": str(Path(dataset_root).resolve()),
        "run_dir": str(run_dir),
        "pretrained": ray.put(pretrained) if pretrained is not None else None,
        # Ray Train V1 does not restore a run by name; there the latest checkpoint is handed over explicitly.
        "resume_from": str(latest[0]) if latest is not None and not _train_v2_enabled() else None,
        "fail_at_epoch": int(fail_at) if fail_at not in (None, "") else None,
        "fail_marker": str(run_dir / ".test-fail-marker"),
    }
    data_options: dict[str, Any] = {}
    if cfg.ingest == "ray_data":
        from workloads.vision.ingest import ExactValidationDataConfig, data_cpu_shortfall, training_datasets

        shortfall = data_cpu_shortfall(cfg)
        if shortfall is not None:
            raise TrainingError(shortfall)
        data_options = {"datasets": training_datasets(dataset_root, layout, cfg),
                        "dataset_config": ExactValidationDataConfig()}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        **data_options,
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker=resources),
        run_config=run_config(run_dir, cfg.num_to_keep, "val_accuracy", cfg.max_failures),
    )
    try:
        result = trainer.fit()
    except Exception as exc:  # noqa: BLE001 - Ray wraps worker errors; show the root cause once
        raise TrainingError(f"training run {params.run_name!r} failed: {root_cause(exc)}") from None
    if getattr(result, "error", None) is not None:
        raise TrainingError(f"training run {params.run_name!r} failed: {root_cause(result.error)}")
    returned = getattr(result, "return_value", None) or {}
    if "diverged" in returned:
        raise TrainingError(divergence_message(params.run_name, returned["diverged"]))
    return outcome_from_disk(run_dir, list(returned.get("epochs_trained", [])), skipped=False)


def divergence_message(run_name: str, where: dict) -> str:
    """One paragraph: where training diverged and which settings to lower."""
    return (f"training run {run_name!r} diverged: at epoch {where['epoch']}, step {where['step']} of "
            f"{where['steps_per_epoch']}, the loss was {where['loss']:.4g} and the gradients were not finite, so "
            f"training stopped there. Lower train.lr (the peak rate was {where['lr']:.3g} for a global batch of "
            f"{where['batch_size']}) or train.batch_size, or lengthen train.warmup_epochs; train.grad_clip_norm "
            "bounds each step. Checkpoints of earlier epochs are kept, and the same run_name resumes from the "
            "latest one.")


def print_training_summary(outcome: TrainingOutcome) -> None:
    """Print where the best checkpoint is and the final metrics, for the job's last log lines."""
    print(f"Run directory: {outcome.run_dir}")
    print(f"Metrics: {outcome.metrics_csv}")
    if outcome.loss_curve:
        print(f"Loss curve: {outcome.loss_curve}")
    if outcome.best_checkpoint:
        best = outcome.best_metrics
        print(f"Best checkpoint: {outcome.best_checkpoint} (epoch {int(best['epoch'])}, "
              f"val_accuracy {best['val_accuracy']:.4f}, val_loss {best['val_loss']:.4f})")
    if outcome.final_metrics:
        final = outcome.final_metrics
        print("Final metrics: " + ", ".join(
            f"{key}={final[key]:.4g}" if key != "epoch" else f"epoch={int(final[key])}"
            for key in METRIC_FIELDS if key in final))
