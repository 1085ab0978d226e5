"""The vision workload's training loop without Ray Train: the baselines of benchmarks/train_throughput.py.

A baseline that copies the workload's loop goes stale the day the loop changes (a new
memory format, a communication hook, another optimizer). So the baselines here run the
workload's own code: ``setup_worker``, ``train_one_epoch``, ``evaluate`` and
``epoch_metrics`` from ``workloads.vision.training.loop``, built from the very config that
``run_training`` hands to Ray Train. Only the calls into Ray Train are swapped for what
plain PyTorch does in their place (:func:`without_ray_train`), so the difference between
the two sides is Ray Train's and nothing else.

Run by ``torchrun`` (``python -m torch.distributed.run ... benchmarks/plain_torch.py CONFIG``),
each process trains as one DDP rank over gloo and rank 0 prints one ``RESULT {json}`` line
with the last epoch's metrics.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def workload_loop_config(params, info) -> dict:
    """The ``train_loop_config`` that ``run_training(params, info)`` gives TorchTrainer, taken instead of fitted."""
    from workloads.vision.training import stage as train

    captured: dict[str, Any] = {}

    def capture(train_loop, loop_config, *args, **kwargs):
        captured.update(loop_config)
        return SimpleNamespace(return_value={})

    if params.train.ingest != "torch":
        raise SystemExit("the plain-PyTorch baseline reads Parquet in a DataLoader: use ingest torch")
    with mock.patch.object(train, "fit", capture):
        train.run_training(params, info)
    return captured


@contextlib.contextmanager
def without_ray_train(rank: int, world_size: int) -> Iterator[None]:
    """Ray Train's calls in ``setup_worker`` replaced by their plain-PyTorch equivalents, on the CPU.

    ``prepare_model`` wraps in DDP as Ray Train does on the CPU (same keyword arguments);
    ``prepare_data_loader`` keeps the loader, whose sampler already shards by rank. Ray itself
    must not start here: ``ray.init`` raises instead of quietly starting a cluster.
    """
    import ray
    import ray.train
    import ray.train.torch
    import torch

    def prepare_model(model, parallel_strategy_kwargs=None, **_):
        if world_size > 1:
            return torch.nn.parallel.DistributedDataParallel(model, **(parallel_strategy_kwargs or {}))
        return model

    def no_ray(*args, **kwargs):
        raise RuntimeError("the plain-PyTorch baseline called into Ray")

    context = SimpleNamespace(get_world_rank=lambda: rank, get_world_size=lambda: world_size)
    runtime = SimpleNamespace(get_node_id=lambda: "plain-torch")
    with contextlib.ExitStack() as stack:
        for target, name, value in (
            (ray.train, "get_context", lambda: context),
            (ray.train.torch, "get_device", lambda: torch.device("cpu")),
            (ray.train.torch, "prepare_model", prepare_model),
            (ray.train.torch, "prepare_data_loader", lambda loader, **_: loader),
            (ray, "get_runtime_context", lambda: runtime),
            (ray, "init", no_ray),
            (ray, "get", no_ray),
        ):
            stack.enter_context(mock.patch.object(target, name, value))
        yield


def setup_plain_worker(config: dict, rank: int, world_size: int):
    """The workload's ``Worker`` (model, optimizer, schedule, batches) built without Ray Train."""
    from workloads.vision.training.loop import setup_worker

    with without_ray_train(rank, world_size):
        return setup_worker(config)


def describe(worker) -> str:
    """What the worker trains with, read from the objects themselves: wrapper, hooks, memory format, optimizer."""
    import torch

    model = worker.model
    hooks = [getattr(hook, "__name__", repr(hook)) for hook, _ in getattr(model, "_comm_hooks", [])]
    conv = next(p for p in worker.unwrapped_model.parameters() if p.ndim == 4)
    layout = "channels_last" if conv.is_contiguous(memory_format=torch.channels_last) else "contiguous"
    fused = " (fused)" if worker.optimizer.defaults.get("fused") else ""
    wrapper = f"DDP with {', '.join(hooks) or 'fp32 all-reduce'}" if hasattr(model, "module") else "no DDP"
    return (f"{wrapper}, {layout}, {type(worker.optimizer).__name__}{fused}, "
            f"{torch.get_num_threads()} thread(s) per process")


class InMemoryBatches:
    """Batches decoded and augmented once, then replayed: the training step without its data path."""

    def __init__(self, batches: list):
        self.batches = batches
        self.steps_per_epoch = len(batches)

    def train_epoch(self, epoch: int) -> Iterator:
        """The same batches every epoch."""
        return iter(self.batches)

    def val_batches(self) -> Iterator:
        """No validation: only the training pass is timed."""
        return iter(())


# --------------------------------------------------------------------------- torchrun


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_torchrun(config_file: Path, processes: int, env: dict[str, str], timeout_s: float = 1800) -> dict:
    """Train with ``processes`` torchrun ranks on loopback; return rank 0's metrics of the last epoch."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), __file__, str(config_file)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"torchrun exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def ddp_main(config_file: str) -> None:
    """One torchrun rank: the workload's epochs (train, evaluate, metrics), no checkpoints."""
    import torch.distributed as dist

    from workloads.vision.training.loop import epoch_metrics, evaluate, train_one_epoch

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    config = json.loads(Path(config_file).read_text(encoding="utf-8"))
    worker = setup_plain_worker(config, rank, world_size)
    metrics: dict = {}
    for epoch in range(worker.cfg.epochs):
        training = train_one_epoch(worker, epoch)
        metrics = epoch_metrics(worker, epoch, training, evaluate(worker))
    if rank == 0:
        print("RESULT " + json.dumps({**metrics, "setup": describe(worker)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ddp_main(sys.argv[1])
