"""Which precision a worker computes in: bf16 autocast or fp32, chosen on the worker from its own device.

bf16 autocast pays on a GPU and on CPUs with bf16 instructions (``avx512_bf16``, AMX's ``amx_bf16``):
a ResNet-18 step at 64 px ran 1.56× faster on such a CPU. On other CPUs PyTorch emulates bf16, which
is slower than fp32, so ``amp: auto`` leaves them in fp32. The choice is made where the model runs,
since the machine that submits a job may have another CPU than the cluster's.

Only the forward pass and the loss run under autocast: the weights, their gradients, the optimizer's
state and batch-norm's running statistics stay fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

# The CPU flags (as /proc/cpuinfo names them) of native bf16 arithmetic.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")
AmpSetting = Union[Literal["auto"], bool]


@dataclass(frozen=True)
class Precision:
    """The precision a worker runs its model in, and why."""

    autocast: bool  # bf16 autocast of the forward pass and the loss
    reason: str  # a few words: why this precision, for the job's log

    @property
    def name(self) -> str:
        """``bf16`` or ``fp32``: what the run's metrics and records say."""
        return "bf16" if self.autocast else "fp32"

    def line(self) -> str:
        """``precision: bf16 autocast (CPU has avx512_bf16)``: the job log's line at the start of training."""
        return f"precision: {'bf16 autocast' if self.autocast else 'fp32'} ({self.reason})"

    def autocast_context(self, device_type: str) -> Any:
        """The ``torch.autocast`` context for a forward pass on ``device_type`` (a no-op in fp32)."""
        import torch

        return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=self.autocast)


    def keep_batch_norm_in_fp32(self, model: Any, device_type: str) -> Any:
        """``model`` with every batch-norm layer given fp32 input under bf16 autocast on a CPU; returns it.

        CPU autocast runs batch norm in its input's dtype, so after a bf16 convolution it normalized
        in bf16 and handed bf16 on to the residual additions: the food101 recipe then ended 0.015 lower
        on the 64 px development set (0.412-0.418 over three seeds, against 0.406-0.440 in fp32). With
        fp32 input to batch norm, the normalization, the residual stream and the activations between
        convolutions stay fp32, only the convolutions run in bf16, and the same seeds ended at
        0.424-0.438, at 0.89x bf16's step time and 1.4x fp32's (``docs/benchmarks.md``). A forward
        pre-hook leaves the weights and checkpoints those of a plain model. On a GPU, not measured,
        batch norm stays as autocast runs it.
        """
        if not (self.autocast and device_type == "cpu"):
            return model
        from torch import nn

        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.register_forward_pre_hook(_fp32_input)
        return model


def _fp32_input(module: Any, args: tuple) -> tuple:
    return (args[0].float(), *args[1:])


def cpu_bf16_flags(cpuinfo_text: str) -> list[str]:
    """The native bf16 flags among the ``flags`` lines of ``/proc/cpuinfo``'s text, in ``CPU_BF16_FLAGS`` order."""
    flags: set[str] = set()
    for line in cpuinfo_text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            flags.update(value.split())
    return [flag for flag in CPU_BF16_FLAGS if flag in flags]


def read_cpuinfo() -> str:
    """This machine's ``/proc/cpuinfo``, or '' where there is none (macOS, Windows): then fp32 is chosen."""
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def choose_precision(amp: AmpSetting, device_type: str, cpuinfo_text: str | None = None) -> Precision:
    """The precision for ``amp`` (``auto``, true or false) on a device of ``device_type`` (``cpu``, ``cuda``).

    ``cpuinfo_text``: the CPU's ``/proc/cpuinfo`` (read from this machine when None).
    """
    if amp is False:
        return Precision(False, "amp: false")
    if device_type != "cpu":
        return Precision(True, "GPU" if device_type == "cuda" else f"{device_type} device")
    found = cpu_bf16_flags(read_cpuinfo() if cpuinfo_text is None else cpuinfo_text)
    if found:
        return Precision(True, f"CPU has {found[0]}")
    if amp is True:
        return Precision(True, "amp: true; this CPU has no bf16 instructions, so PyTorch emulates them")
    return Precision(False, f"CPU has neither {' nor '.join(CPU_BF16_FLAGS)}")


def agreed_precision(own: Precision, world_size: int) -> Precision:
    """One precision for every rank of a DDP group: bf16 only where every rank chose it.

    A synchronous step waits for the slowest rank, and a rank without bf16 instructions is the slow one
    either way, so fp32 everywhere costs no speed and keeps every rank's arithmetic the same.
    """
    if world_size == 1:
        return own
    import torch.distributed as dist

    chosen: list[Any] = [None] * world_size
    dist.all_gather_object(chosen, (own.autocast, own.reason))
    if all(autocast == own.autocast for autocast, _ in chosen):
        return own
    first_fp32 = next(index for index, (autocast, _) in enumerate(chosen) if not autocast)
    return Precision(False, f"rank {first_fp32}: {chosen[first_fp32][1]}")
