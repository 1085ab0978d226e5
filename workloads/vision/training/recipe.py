"""The training recipe: optimizer, learning-rate schedule, batch-norm statistics for evaluation, and the guards
against a run that blows up."""

from __future__ import annotations

import math
from typing import Any

from workloads.ray_train.precision import Precision, choose_precision
from workloads.vision.config import TrainConfig
from workloads.vision.training.model import HEAD_PREFIXES

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
        # The fused kernel updates every tensor in one pass: on a CPU core it took 8 ms per
        # ResNet-18 step against 50 ms for the per-tensor loop (docs/benchmarks.md).
        return torch.optim.AdamW(param_groups, lr=cfg.peak_lr(), fused=True)
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


def restart_schedule_at(optimizer, scheduler) -> None:
    """Set every group's learning rate to what the schedule gives at the scheduler's current step.

    A resumed optimizer carries the rate of the old schedule; when ``train.epochs`` grew,
    the schedule stretched, so the rate is recomputed for the step training resumes at.
    """
    for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base_lr * factor(scheduler.last_epoch)


# ResNet-18 halves its feature maps five times; at this size or below, layer4's first convolution
# (3x3, stride 2) gets a 1x1 map. PyTorch's CPU bf16 kernel then returns non-finite weight gradients
# now and then (about 1 step in 3 for that layer alone, 1 in 16 for the whole model at 16 px), which
# ends training as diverged. 17 px and up never did in hundreds of steps.
_RESNET_BF16_MAX_BROKEN_SIZE = 16


def training_precision(cfg: TrainConfig, height: int, width: int, device_type: str,
                       cpuinfo_text: str | None = None) -> Precision:
    """The precision a training worker runs in: :func:`choose_precision`'s, less what the model cannot train in.

    ``amp: auto`` keeps ResNet-18 in fp32 on a CPU for images of 16 px or less; an explicit
    ``amp: true`` is obeyed. ``cpuinfo_text`` as for :func:`choose_precision`.
    """
    chosen = choose_precision(cfg.amp, device_type, cpuinfo_text)
    if (cfg.amp == "auto" and chosen.autocast and device_type == "cpu" and cfg.model == "resnet18"
            and min(height, width) <= _RESNET_BF16_MAX_BROKEN_SIZE):
        return Precision(False, f"{chosen.reason}, but at {min(height, width)} px its bf16 convolutions "
                                "give ResNet-18 non-finite gradients; amp: true forces bf16")
    return chosen


def epoch_warning(metrics: dict[str, float], num_classes: int, previous: dict[str, float] | None = None) -> str:
    """A warning when validation loss has exploded while accuracy sits at chance two epochs in a row, else ''.

    One such epoch alone is no sign: three of four runs of the food101 spec on a GPU at 224 px had
    one right after the start and learned normally from the next epoch on.
    """
    chance_loss = math.log(num_classes)
    chance_accuracy = 1.0 / num_classes

    def blown_up(epoch_metrics: dict[str, float]) -> bool:
        return epoch_metrics["val_loss"] > 3 * chance_loss and epoch_metrics["val_accuracy"] < 1.5 * chance_accuracy

    if previous is None or not (blown_up(previous) and blown_up(metrics)):
        return ""
    return (f" WARNING: validation loss {metrics['val_loss']:.4g} (the epoch before: {previous['val_loss']:.4g}) "
            f"is over 3x that of a uniform guess ({chance_loss:.2f}) and accuracy is at chance "
            f"({chance_accuracy:.2f}) for the second epoch in a row: training is unstable. "
            "Lower train.lr or train.batch_size, or lengthen train.warmup_epochs.")


class Diverged(Exception):
    """The loss or the gradients stopped being finite; ``args`` are (step index within the epoch, loss)."""


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


def divergence_report(diverged: Diverged, epoch: int, steps_per_epoch: int, cfg: TrainConfig) -> dict:
    """Where training diverged, as the workers return it to the driver (``epoch`` 0-based)."""
    step, loss = diverged.args  # step: index within the epoch
    return {"epoch": epoch + 1, "step": step + 1, "steps_per_epoch": steps_per_epoch, "loss": loss,
            "lr": cfg.peak_lr(), "batch_size": cfg.global_batch}


def divergence_message(run_name: str, where: dict) -> str:
    """One paragraph: where training diverged and which settings to lower."""
    return (f"training run {run_name!r} diverged: at epoch {where['epoch']}, step {where['step']} of "
            f"{where['steps_per_epoch']}, the loss was {where['loss']:.4g} and the gradients were not finite, so "
            f"training stopped there. Lower train.lr (the peak rate was {where['lr']:.3g} for a global batch of "
            f"{where['batch_size']}) or train.batch_size, or lengthen train.warmup_epochs; train.grad_clip_norm "
            "bounds each step. Checkpoints of earlier epochs are kept, and the same run_name resumes from the "
            "latest one.")


def recalibrate_batch_norm(worker: Any) -> None:
    """Estimate every batch-norm layer's running statistics again, with the epoch's final weights, from this rank's
    last training batches (``worker.recent_batches``, a loop Worker); average them across ranks.

    During training each step moves the statistics a tenth of the way towards those of one batch, taken
    with weights that have changed since. From 8 images per worker at 224 px that described the test photos
    so badly that the validation loss was 8 and 15 after the first two epochs, and about 1.4 at the end. A
    plain average over many batches with the weights fixed is what evaluation needs (Wu & Johnson,
    "Rethinking 'Batch' in BatchNorm", 2021). It costs a forward pass over those batches.
    """
    import torch
    import torch.distributed as dist

    batches = worker.recent_batches
    model = worker.unwrapped_model
    norms = [module for module in model.modules() if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]
    if not batches or not norms:
        return
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for images in batches:
            with torch.autocast(device_type=worker.device.type, dtype=torch.bfloat16, enabled=worker.use_amp):
                model(worker.normalize(images))
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    if worker.world_size > 1:
        for norm in norms:
            for statistic in (norm.running_mean, norm.running_var):
                dist.all_reduce(statistic)
                statistic /= worker.world_size
    batches.clear()
