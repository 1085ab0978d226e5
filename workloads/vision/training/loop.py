"""The loop every Ray Train worker runs, in the shape of torchvision's reference training script:
:func:`train_one_epoch`, :func:`evaluate` and :func:`save_checkpoint`, tied together by
:func:`train_loop_per_worker`.

Rank 0 writes the checkpoint (``state.pt``, ``meta.json``), ``metrics.csv`` and TensorBoard's
event file after every epoch; every rank reports the epoch's metrics to Ray Train, which keeps the checkpoints.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads import storage
from rayjobs_agent import EventKind, emit
from workloads.storage import StoragePath
from workloads.ray_train.metrics import (METRICS_CSV, read_metrics_csv, write_metrics_csv,
                                       write_tensorboard_events)
from workloads.ray_train.precision import Precision, agreed_precision
from workloads.ray_train.trainer import TrainingError
from workloads.vision.config import TrainConfig
from workloads.vision.images import ImageLayout, normalize
from workloads.vision.reading.batches import RayDataBatches, TorchBatches
from workloads.vision.training.model import META_FILE, STATE_FILE, build_model, checkpoint_state, read_checkpoint_state
from workloads.vision.training.recipe import (HEAD_WEIGHTS_GROUP, Diverged, DivergenceGuard, divergence_report,
                                              epoch_warning, make_optimizer, make_scheduler, recalibrate_batch_norm,
                                              restart_schedule_at, training_precision)

# data_wait_s: seconds per worker blocked waiting for the next batch; compute_s: the
# rest of the training pass (forward, backward, optimizer step).
METRIC_FIELDS = ["epoch", "train_loss", "val_loss", "val_accuracy", "images_per_s", "epoch_s", "data_wait_s",
                 "compute_s", "lr"]
SECONDS_BETWEEN_PROGRESS_LINES = 30.0
# Steps within an epoch, for the follower's live bar: often enough to move it, rarely enough to cost nothing.
SECONDS_BETWEEN_STEP_EVENTS = 2.0


def say(message: str) -> None:
    """Print one line from a worker, once.

    Ray Train V2 reroutes print() in workers through logging and echoes it too, which
    doubles every line; writing to stdout directly keeps one copy.
    """
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


@dataclass
class Worker:
    """What one Ray Train worker trains with: the settings, its rank, the model and the recipe."""

    cfg: TrainConfig
    classes: list[str]
    layout: ImageLayout
    run_dir: StoragePath
    rank: int
    world_size: int
    device: Any
    precision: Precision
    memory_format: Any
    batches: TorchBatches | RayDataBatches
    model: Any  # wrapped by Ray Train for DDP when there are several workers
    optimizer: Any
    scheduler: Any
    loss_fn: Any
    guard: DivergenceGuard
    nodes: list[str] = field(default_factory=list)  # the Ray node id of every rank, in rank order
    # The epoch's last training batches (uint8, as read), kept to re-estimate batch-norm statistics.
    recent_batches: deque | None = None

    @property
    def unwrapped_model(self):
        """The model without its DDP wrapper: what checkpoints and evaluation use."""
        return getattr(self.model, "module", self.model)

    @property
    def use_amp(self) -> bool:
        """Whether the forward pass and the loss run under bf16 autocast."""
        return self.precision.autocast

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (the same on every rank)."""
        return max(1, self.batches.steps_per_epoch)

    def normalize(self, images):
        """A uint8 batch as the model's float input, in the worker's memory format."""
        return normalize(images, self.layout, self.memory_format)

    def all_reduce(self, values: list[float], op=None) -> list[float]:
        """``values`` combined across the ranks (summed unless ``op`` says otherwise)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
        return tensor.tolist()


@dataclass
class EpochTraining:
    """One rank's figures of one epoch's training pass."""

    started: float  # time.perf_counter() when the epoch began
    loss_sum: float
    seen: float
    data_wait: float
    seconds: float
    lr: float  # the head's learning rate at the start of the epoch


@dataclass
class Evaluation:
    """One rank's sums over its share of the validation split."""

    loss_sum: float
    correct: float
    seen: float


def setup_worker(config: dict) -> Worker:
    """Build this worker's batches, model (from the pretrained weights when given), optimizer and schedule."""
    import ray
    import ray.train
    import ray.train.torch
    import torch

    cfg = TrainConfig.model_validate(config["train"])
    layout = ImageLayout.from_manifest({"layout": config["layout"]})
    if cfg.fine_tunes:
        # Pretrained weights expect the inputs they were trained on; the checkpoint keeps
        # this layout, so inference normalizes the same way.
        layout = layout.with_imagenet_statistics()
    # One intra-op thread per reserved CPU: Ray reserved cpus_per_worker for this
    # process, and more threads would contend with the other workers on the node.
    torch.set_num_threads(cfg.cpu_threads())

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(cfg.seed + rank)
    device = ray.train.torch.get_device()
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    if cfg.ingest == "ray_data":
        batches = RayDataBatches(config["train_rows"], cfg, world_size, device)
    else:
        decode_on_device = cfg.decodes_on_device(device.type, layout.encoding)
        batches = TorchBatches(storage.storage_path(config["dataset_root"]), cfg, layout, rank, world_size, device,
                               decode_on_device)
        if rank == 0 and decode_on_device:
            say(f"decode: JPEGs decoded and augmented on {device.type}, the loader only reads them")

    pretrained = ray.get(config["pretrained"]) if config.get("pretrained") is not None else None
    model = build_model(cfg, len(config["classes"]), layout, pretrained)
    del pretrained
    model = model.to(memory_format=memory_format)
    if cfg.syncs_batch_norm(world_size):
        from workloads.ray_train.sync_batchnorm import synchronise_batch_norm

        model = synchronise_batch_norm(model, device.type)
        if rank == 0:
            say(f"batch norm: the moments of the global batch of {cfg.global_batch} ({world_size} workers' shares)")
    # Gradients that live in DDP's communication buckets skip one copy of every gradient per step.
    model = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"gradient_as_bucket_view": True})
    if world_size > 1 and cfg.gradient_allreduce == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    nodes = _node_of_every_rank(ray.get_runtime_context().get_node_id(), world_size)
    precision = agreed_precision(training_precision(cfg, layout.height, layout.width, device.type), world_size)
    if rank == 0:
        say(precision.line())
        # A restart after a lost node may have fewer workers than the layout planned (an elastic group).
        resized = cfg.world_size_line(world_size, cfg.global_batch)
        if resized:
            say(resized)
    precision.keep_batch_norm_in_fp32(model, device.type)
    optimizer = make_optimizer(getattr(model, "module", model), cfg)
    scheduler = make_scheduler(optimizer, cfg, max(1, batches.steps_per_epoch))
    return Worker(
        cfg=cfg, classes=list(config["classes"]), layout=layout, run_dir=storage.storage_path(config["run_dir"]),
        rank=rank, world_size=world_size, device=device, precision=precision, memory_format=memory_format,
        batches=batches, model=model, optimizer=optimizer, scheduler=scheduler,
        loss_fn=torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
        # Reading a flag from an accelerator waits for it; on the CPU the check is free.
        guard=DivergenceGuard(device, check_every=1 if device.type == "cpu" else 25),
        nodes=nodes,
        recent_batches=deque(maxlen=recalibration) if (recalibration := cfg.recalibration_batches(world_size)) else None,
    )


def _node_of_every_rank(node_id: str, world_size: int) -> list[str]:
    """Every rank's Ray node id, gathered over the process group that DDP already set up."""
    if world_size == 1:
        return [node_id]
    import torch.distributed as dist

    gathered: list[str] = [""] * world_size
    dist.all_gather_object(gathered, node_id)
    return gathered


def resume(worker: Worker, resume_from: str | None) -> int:
    """Load the run's latest checkpoint, if there is one; return the index of the first epoch to train.

    Ray Train hands the checkpoint over (a restarted attempt, or the same run name under
    Train V2); ``resume_from`` names it where Ray Train does not.
    """
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and resume_from:
        path, filesystem = storage.arrow_path(storage.storage_path(resume_from))
        checkpoint = ray.train.Checkpoint(path, filesystem=filesystem)
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as checkpoint_dir:
        state = read_checkpoint_state(checkpoint_dir)
    if list(state["classes"]) != worker.classes:
        raise TrainingError(
            f"the checkpoint of run {worker.run_dir.name!r} was trained on classes {state['classes']}, "
            f"but the dataset has {worker.classes}; use a new run_name"
        )
    worker.unwrapped_model.load_state_dict(state["model"])
    worker.optimizer.load_state_dict(state["optimizer"])
    worker.scheduler.load_state_dict(state["scheduler"])
    start_epoch = int(state["epoch"]) + 1
    restart_schedule_at(worker.optimizer, worker.scheduler)
    if worker.rank == 0:
        say(f"Resuming run {worker.run_dir.name!r} after epoch {start_epoch} from {checkpoint.path}")
    return start_epoch


def train_one_epoch(worker: Worker, epoch: int) -> EpochTraining:
    """One pass over this rank's training batches of epoch index ``epoch``.

    Raises :class:`Diverged` at the first step whose loss or gradients are not finite.
    """
    import torch

    cfg, model, device = worker.cfg, worker.model, worker.device
    model.train()
    lr = worker.optimizer.param_groups[HEAD_WEIGHTS_GROUP]["lr"]  # the backbone's is zero while it is frozen
    # Summed on the device so the loop never waits for the accelerator to report a number.
    loss_total = torch.zeros((), dtype=torch.float64, device=device)
    seen = 0.0
    data_wait = 0.0
    epoch_start = last_progress = last_step_event = time.perf_counter()
    train_batches = worker.batches.train_epoch(epoch)
    step = 0
    while True:
        wait_start = time.perf_counter()
        try:
            images, labels = next(train_batches)
        except StopIteration:
            break
        data_wait += time.perf_counter() - wait_start
        if worker.recent_batches is not None:
            worker.recent_batches.append(images)
        images = worker.normalize(images)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=worker.use_amp):
            logits = model(images)
            loss = worker.loss_fn(logits.float(), labels)
        worker.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # Also the divergence check: DDP has averaged the gradients, so every rank sees the same norm.
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip_norm or math.inf)
        worker.guard.observe(step, loss, grad_norm)
        worker.optimizer.step()
        worker.scheduler.step()
        batch = labels.shape[0]
        loss_total += loss.detach().double() * batch
        seen += batch
        step += 1
        now = time.perf_counter()
        if worker.rank == 0 and now - last_step_event >= SECONDS_BETWEEN_STEP_EVENTS:
            last_step_event = now
            emit(EventKind.STEP, epoch=epoch + 1, step=step, steps=worker.steps_per_epoch)
        if worker.rank == 0 and now - last_progress >= SECONDS_BETWEEN_PROGRESS_LINES:
            last_progress = now
            say(f"  epoch {epoch + 1}/{cfg.epochs} step {step}/{worker.steps_per_epoch} "
                f"loss {loss_total.item() / seen:.4f} ({seen * worker.world_size / (now - epoch_start):.1f} images/s)")
    worker.guard.check()
    loss_sum = loss_total.item()
    return EpochTraining(started=epoch_start, loss_sum=loss_sum, seen=seen, data_wait=data_wait,
                         seconds=time.perf_counter() - epoch_start, lr=lr)


def evaluate(worker: Worker) -> Evaluation:
    """Loss and correct predictions over this rank's share of the validation split."""
    import torch
    import torch.distributed as dist

    recalibrate_batch_norm(worker)
    evaluated = worker.unwrapped_model
    if worker.world_size > 1:
        # DDP hands rank 0's batch-norm statistics to the others before each forward
        # pass, and each rank then updates them with its own last batch. Taking rank
        # 0's (the ones saved in the checkpoint) makes every rank evaluate the same model.
        for buffer in evaluated.buffers():
            dist.broadcast(buffer, src=0)
    evaluated.eval()
    loss_sum = correct = seen = 0.0
    with torch.no_grad():
        for images, labels in worker.batches.val_batches():
            images = worker.normalize(images)
            with torch.autocast(device_type=worker.device.type, dtype=torch.bfloat16, enabled=worker.use_amp):
                logits = evaluated(images)
            logits = logits.float()
            loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(dim=1) == labels).sum().item()
            seen += labels.shape[0]
    return Evaluation(loss_sum=loss_sum, correct=correct, seen=seen)


def epoch_metrics(worker: Worker, epoch: int, training: EpochTraining, evaluation: Evaluation) -> dict:
    """The epoch's metrics over all ranks: ``METRIC_FIELDS`` plus the validation counts."""
    import torch.distributed as dist

    epoch_seconds = time.perf_counter() - training.started
    compute = training.seconds - training.data_wait
    loss_sum, seen, val_loss_sum, val_correct, val_seen, data_wait, compute = worker.all_reduce(
        [training.loss_sum, training.seen, evaluation.loss_sum, evaluation.correct, evaluation.seen,
         training.data_wait, compute])
    train_seconds, epoch_seconds = worker.all_reduce(
        [training.seconds, epoch_seconds], dist.ReduceOp.MAX if worker.world_size > 1 else None)
    return {
        "epoch": epoch + 1,
        "train_loss": loss_sum / max(1.0, seen),
        "val_loss": val_loss_sum / max(1.0, val_seen),
        "val_accuracy": val_correct / max(1.0, val_seen),
        "val_correct": int(val_correct),
        "val_rows": int(val_seen),
        "images_per_s": seen / max(1e-9, train_seconds),
        "epoch_s": epoch_seconds,
        "data_wait_s": data_wait / worker.world_size,
        "compute_s": compute / worker.world_size,
        "lr": training.lr,
        "precision": worker.precision.name,  # text: in the report and run.json, never in metrics.csv
        "decode": "device" if getattr(worker.batches, "decode_on_device", False) else "loader",  # text, likewise
    }


def save_checkpoint(worker: Worker, epoch: int, metrics: dict, history: list[dict]) -> list[dict]:
    """Write epoch index ``epoch``'s checkpoint and ``metrics.csv`` (rank 0), and report it to Ray Train (every rank).

    Returns the metrics rows so far, ``metrics`` last.
    """
    import ray.train
    import torch

    cfg = worker.cfg
    with tempfile.TemporaryDirectory(prefix="rayjobs-ckpt-") as tmp:
        report_checkpoint = None
        if worker.rank == 0:
            history = [r for r in history if r["epoch"] < epoch + 1] + [metrics]
            write_metrics_csv(worker.run_dir / METRICS_CSV, history, METRIC_FIELDS)
            write_tensorboard_events(worker.run_dir, history)
            torch.save(checkpoint_state(worker.unwrapped_model, worker.optimizer, worker.scheduler, epoch, cfg,
                                        worker.layout, worker.classes), Path(tmp) / STATE_FILE)
            (Path(tmp) / META_FILE).write_text(json.dumps(metrics, indent=2), encoding="utf-8")
            report_checkpoint = ray.train.Checkpoint.from_directory(tmp)
            say(f"epoch {epoch + 1}/{cfg.epochs}: train_loss {metrics['train_loss']:.4f} "
                f"val_loss {metrics['val_loss']:.4f} val_accuracy {metrics['val_accuracy']:.4f} "
                f"({metrics['images_per_s']:.1f} images/s, {metrics['epoch_s']:.1f}s, "
                f"data wait {metrics['data_wait_s']:.1f}s, compute {metrics['compute_s']:.1f}s)")
            # A line of its own: a follower that tells the epoch in its own words leaves the line above out.
            previous = history[-2] if len(history) > 1 else None
            warning = epoch_warning(metrics, len(worker.classes), previous).strip()
            if warning:
                say(warning)
        ray.train.report(metrics, checkpoint=report_checkpoint, checkpoint_dir_name=f"checkpoint_epoch_{epoch + 1:04d}")
    return history


def train_loop_per_worker(config: dict) -> dict:
    """Body of every Ray Train worker: train, evaluate, checkpoint and report each epoch.

    Returns (from rank 0, as ``Result.return_value``) the epoch numbers this attempt
    trained, or where training diverged.
    """
    worker = setup_worker(config)
    start_epoch = resume(worker, config.get("resume_from"))
    metrics_csv = worker.run_dir / METRICS_CSV
    history = []
    if worker.rank == 0 and storage.exists(metrics_csv):
        history = [r for r in read_metrics_csv(metrics_csv) if r["epoch"] <= start_epoch]

    trained: list[int] = []
    for epoch in range(start_epoch, worker.cfg.epochs):
        try:
            training = train_one_epoch(worker, epoch)
        except Diverged as diverged:
            report = divergence_report(diverged, epoch, worker.steps_per_epoch, worker.cfg)
            if worker.rank == 0:
                say(f"epoch {report['epoch']}/{worker.cfg.epochs} step {report['step']}: loss {report['loss']:.4g}, "
                    "gradients not finite; stopping")
            return {"diverged": report}
        evaluation = evaluate(worker)
        metrics = epoch_metrics(worker, epoch, training, evaluation)
        history = save_checkpoint(worker, epoch, metrics, history)
        trained.append(epoch + 1)
    return {"start_epoch": start_epoch, "epochs_trained": trained, "worker_nodes": worker.nodes}
