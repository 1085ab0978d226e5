"""Trials for the Ray Tune tests of :mod:`workloads.ray_train.sweep` that report set figures instead of training.

What Tune's scheduler does with a trial then depends on nothing but the figures; the trial a killed driver
interrupts runs a real Ray Train trainer of one worker, so that its resuming from a checkpoint is Ray Train's.
Each is a ``run_trial`` as :func:`workloads.ray_train.sweep.run_sweep` calls it, importable by the Ray workers
that run trials.
"""

from __future__ import annotations

from typing import Any

# Two epochs are the fewest that show what the tests check: ASHA stopping a trial at its first rung while
# another goes on, and an interrupted trial resuming after the checkpoint of its first epoch.
EPOCHS = 2


def report_the_learning_rate(values: dict[str, Any], name: str, trials_root: Any, callbacks: list[Any]) -> None:
    """A trial whose ``val_accuracy`` is its ``workload.train.lr`` every epoch: ``EPOCHS`` epochs, each written
    to the trial's ``metrics.csv`` and reported to Tune, as a training run would."""
    from ray import tune

    from workloads import storage

    quality = float(values["workload.train.lr"])
    folder = trials_root / name
    storage.make_folder(folder)
    lines = ["epoch,val_accuracy"]
    for epoch in range(1, EPOCHS + 1):
        lines.append(f"{epoch},{quality}")
        storage.write_text(folder / "metrics.csv", "\n".join(lines) + "\n")
        tune.report({"epoch": epoch, "val_accuracy": quality})


def refit_at_half_the_learning_rate(values: dict[str, Any], name: str, storage_root: Any) -> None:
    """A refit run as :func:`workloads.ray_train.sweep.run_sweep` calls it: ``EPOCHS`` epochs whose ``val_accuracy`` is
    half the learning rate, written to ``<storage_root>/<name>/metrics.csv``; each call is a line in its ``calls``."""
    from workloads import storage

    folder = storage_root / name
    storage.make_folder(folder)
    rows = [f"{epoch},{float(values['workload.train.lr']) / 2}" for epoch in range(1, EPOCHS + 1)]
    storage.write_text(folder / "metrics.csv", "epoch,val_accuracy\n" + "\n".join(rows) + "\n")
    calls = folder / "calls"
    storage.write_text(calls, (storage.read_text(calls) if storage.exists(calls) else "") + name + "\n")


def train_with_checkpoints_stalling_once(values: dict[str, Any], name: str, trials_root: Any,
                                         callbacks: list[Any]) -> None:
    """The trial of learning rate 0.8 is a real ``TorchTrainer`` of one worker
    (:func:`workloads.ray_train.trainer.fit`), reporting ``val_accuracy`` = its learning rate with a checkpoint
    every epoch, and resuming from Ray Train's checkpoint when there is one; the first time, it reports its first
    epoch and then waits to be killed in its second (touching ``$SWEEP_STALLED``). Any other trial reports its
    figures to Tune without a trainer: that it is not run again is Tune's doing, and a trainer of its own would
    only cost processes. Each start of a trial's training is a line ``<trial> from epoch <n>`` in
    ``$SWEEP_STARTS``."""
    import os

    lr = float(values["workload.train.lr"])
    if lr != 0.8:
        with open(os.environ["SWEEP_STARTS"], "a") as starts:
            starts.write(f"{name} from epoch 1\n")
        report_the_learning_rate(values, name, trials_root, callbacks)
        return

    from workloads.ray_train.config import RayTrainSettings
    from workloads.ray_train.trainer import fit

    settings = RayTrainSettings(num_workers=1, cpus_per_worker=1, max_failures=0, num_to_keep=1)
    config = {"name": name, "lr": lr, "run_dir": str(trials_root / name)}
    fit(_resumable_loop, config, trials_root, name, settings, "val_accuracy", callbacks)


def _resumable_loop(config: dict[str, Any]) -> None:
    import json
    import os
    import tempfile
    import time
    from pathlib import Path

    import ray.train

    from workloads import storage

    checkpoint = ray.train.get_checkpoint()
    done = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            done = json.loads((Path(folder) / "epoch.json").read_text())["epoch"]
    with open(os.environ["SWEEP_STARTS"], "a") as starts:
        starts.write(f"{config['name']} from epoch {done + 1}\n")
    stalled = Path(os.environ["SWEEP_STALLED"])
    metrics = storage.storage_path(config["run_dir"]) / "metrics.csv"
    for epoch in range(done + 1, EPOCHS + 1):
        if config["lr"] == 0.8 and epoch == 2 and not stalled.exists():
            stalled.touch()
            time.sleep(600)
        kept = storage.read_text(metrics).splitlines()[1:epoch] if storage.exists(metrics) else []
        storage.write_text(metrics, "\n".join(["epoch,val_accuracy", *kept, f"{epoch},{config['lr']}"]) + "\n")
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "epoch.json").write_text(json.dumps({"epoch": epoch}))
            ray.train.report({"epoch": epoch, "val_accuracy": config["lr"]},
                             checkpoint=ray.train.Checkpoint.from_directory(folder))


SWEEP_DRIVER = """
import json, os, sys
import ray
ray.init(runtime_env={"env_vars": json.loads(os.environ["SWEEP_JOB_ENV"])})
from jobs.sweep import SweepSpec
from jobs.workload_contract import Demand
from tests.support.sweep_trials import EPOCHS, train_with_checkpoints_stalling_once
from workloads.storage import storage_path
from workloads.ray_train.sweep import run_sweep

sweep = SweepSpec.model_validate({"metric": "val_accuracy", "mode": "max", "search": "grid", "max_concurrent": 1,
                                  "parameters": {"workload.train.lr": {"choice": [0.9, 0.8]}}})
outcome = run_sweep(sweep, train_with_checkpoints_stalling_once, storage_path(sys.argv[1]),
                    Demand("training", 1, 1.0), EPOCHS)
print("TRIALS " + json.dumps([[trial.name, trial.status, trial.epochs] for trial in outcome.trials]), flush=True)
"""
"""A job's driver that runs a sweep of :func:`train_with_checkpoints_stalling_once` under the run folder ``argv[1]``,
joining the Ray of ``RAY_ADDRESS`` with ``$SWEEP_JOB_ENV`` as its job's variables."""
