"""A Ray Train script written the way Ray's own examples are, knowing nothing of rayjobs.

Two workers (``--workers``) fit a line for a few epochs, report loss each epoch and checkpoint from rank 0; a run
restarted by Ray Train continues after its last checkpoint. With ``--hang-at-epoch N`` rank 1 stops
in epoch N without reporting it, the hang the Ray Train guide lists first under troubleshooting; with
``--collective-timeout-s`` as well, rank 0 gives up waiting for it in DDP's gradient all-reduce.
``--die-at-epoch N`` has the last rank's process exit in epoch N of every attempt.
"""

import argparse
import os
import tempfile
import time

import torch

import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_func(config):
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"))
            model.module.load_state_dict(state["model"]) if hasattr(model, "module") else model.load_state_dict(
                state["model"])
            start = state["epoch"] + 1
    inputs = torch.randn(256, 4)
    targets = inputs.sum(dim=1, keepdim=True)
    for epoch in range(start, config["epochs"]):
        if epoch + 1 == config["hang_at_epoch"] and ray.train.get_context().get_world_rank() == 1:
            time.sleep(3600)  # rank 1 never reports this epoch: rank 0 waits for it in ray.train.report
        context = ray.train.get_context()
        if epoch + 1 == config["die_at_epoch"] and context.get_world_rank() == context.get_world_size() - 1:
            os._exit(1)
        time.sleep(config["epoch_s"])
        loss = ((model(inputs) - targets) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as directory:
            if ray.train.get_context().get_world_rank() == 0:
                unwrapped = model.module if hasattr(model, "module") else model
                torch.save({"model": unwrapped.state_dict(), "epoch": epoch}, os.path.join(directory, "state.pt"))
                ray.train.report({"epoch": epoch + 1, "loss": loss.item()},
                                 checkpoint=Checkpoint.from_directory(directory))
            else:
                ray.train.report({"epoch": epoch + 1, "loss": loss.item()})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epoch-s", type=float, default=0.5, help="seconds each epoch takes at least")
    parser.add_argument("--hang-at-epoch", type=int, default=0, help="rank 1 hangs in this epoch (0: never)")
    parser.add_argument("--die-at-epoch", type=int, default=0,
                        help="the last rank's process exits in this epoch (0: never)")
    parser.add_argument("--collective-timeout-s", type=int, default=None, help="gloo's timeout (default: Ray's)")
    parser.add_argument("--max-failures", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (--hang-at-epoch needs two)")
    args = parser.parse_args()
    torch_config = ray.train.torch.TorchConfig(**({"timeout_s": args.collective_timeout_s}
                                                  if args.collective_timeout_s else {}))
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "epoch_s": args.epoch_s,
                           "hang_at_epoch": args.hang_at_epoch, "die_at_epoch": args.die_at_epoch},
        torch_config=torch_config,
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(name="plain", storage_path=args.storage,
                             failure_config=FailureConfig(max_failures=args.max_failures)),
    )
    result = trainer.fit()
    print(f"final loss {result.metrics['loss']:.4f}")
