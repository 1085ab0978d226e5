"""Batch norm whose statistics are those of the global batch, on CPU as well as GPU.

With several workers each normalizes its share of the batch by that share's own mean and
variance: 8 images per worker at global batch 16. ``torch.nn.SyncBatchNorm`` computes them
over every worker's images instead, but refuses CPU tensors (its kernels are CUDA's).
:class:`SyncedBatchNorm` does the same with two all-reduces per layer and step, one in the
forward pass (each channel's sum, sum of squares and count) and one in the backward pass (each
channel's sum of the output gradient, and of it times the normalized input), over whatever
process group the workers share (gloo on CPU). The result is the batch norm of the whole global
batch: ``tests/test_sync_batchnorm.py`` checks it against one process holding every image.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class _GlobalBatchNorm(torch.autograd.Function):
    """Normalize ``x`` by the moments of every rank's batch; gradients through the same global moments."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float,
                factor: float, group: Any) -> torch.Tensor:
        channels = x.size(1)
        dims = [0, *range(2, x.dim())]
        shape = [1, channels] + [1] * (x.dim() - 2)
        # The moments in fp32 whatever the input (bf16 under autocast): a sum of squares of many
        # bf16 values loses the variance.
        x32 = x.float()
        count = x32.new_full((1,), x32.numel() // channels)
        moments = torch.cat([x32.sum(dims), (x32 * x32).sum(dims), count])
        dist.all_reduce(moments, group=group)
        total = moments[-1]
        mean = moments[:channels] / total
        var = (moments[channels:2 * channels] / total - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1 - factor).add_(mean, alpha=factor)
                unbiased = var * total / (total - 1).clamp(min=1)
                running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        normalized = (x32 - mean.view(shape)) * invstd.view(shape)
        out = normalized
        if weight is not None:
            out = out * weight.float().view(shape)
        if bias is not None:
            out = out + bias.float().view(shape)
        ctx.save_for_backward(normalized, weight, invstd)
        ctx.total, ctx.group, ctx.input_dtype, ctx.has_bias = total, group, x.dtype, bias is not None
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        normalized, weight, invstd = ctx.saved_tensors
        channels = normalized.size(1)
        dims = [0, *range(2, normalized.dim())]
        shape = [1, channels] + [1] * (normalized.dim() - 2)
        grad32 = grad_out.float()
        sum_grad = grad32.sum(dims)
        sum_grad_normalized = (grad32 * normalized).sum(dims)
        # This rank's share of the parameters' gradients: DDP averages them across ranks, as it does
        # every other parameter's, which makes them the gradients of the ranks' mean loss.
        grad_weight = sum_grad_normalized.to(weight.dtype) if weight is not None else None
        grad_bias = sum_grad.to(weight.dtype if weight is not None else grad_out.dtype) if ctx.has_bias else None
        reduced = torch.cat([sum_grad, sum_grad_normalized])
        dist.all_reduce(reduced, group=ctx.group)
        mean_grad = (reduced[:channels] / ctx.total).view(shape)
        mean_grad_normalized = (reduced[channels:] / ctx.total).view(shape)
        scale = invstd if weight is None else invstd * weight.float()
        grad_in = (grad32 - mean_grad - normalized * mean_grad_normalized) * scale.view(shape)
        return grad_in.to(ctx.input_dtype), grad_weight, grad_bias, None, None, None, None, None


class SyncedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A batch-norm layer (any number of spatial dimensions) normalizing by the moments of every rank's batch
    in training, on any device; in evaluation, or with one rank, exactly ``nn.BatchNorm``.

    Its parameters and buffers are those of the layer it replaces, so its checkpoints load into a plain model.
    """

    def __init__(self, *args: Any, process_group: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        synced = self.training and dist.is_available() and dist.is_initialized() and \
            dist.get_world_size(self.process_group) > 1
        if not synced:
            return super().forward(input)
        factor = 0.0
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        tracked = self.track_running_stats
        return _GlobalBatchNorm.apply(input, self.weight, self.bias, self.running_mean if tracked else None,
                                      self.running_var if tracked else None, self.eps, factor, self.process_group)


def synchronise_batch_norm(model: nn.Module, device_type: str) -> nn.Module:
    """``model`` with every batch-norm layer normalizing by the global batch: ``nn.SyncBatchNorm`` on CUDA,
    :class:`SyncedBatchNorm` elsewhere. Call it before wrapping the model in DDP."""
    if device_type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return _replace_batch_norms(model)


def _replace_batch_norms(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncedBatchNorm):
        synced = SyncedBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                 module.track_running_stats)
        synced.load_state_dict(module.state_dict())
        synced.train(module.training)
        if module.affine:
            synced.weight.requires_grad_(module.weight.requires_grad)
            synced.bias.requires_grad_(module.bias.requires_grad)
        held = [*module.parameters(), *module.buffers()]
        return synced.to(held[0].device) if held else synced
    for name, child in module.named_children():
        module.add_module(name, _replace_batch_norms(child))
    return module
