"""Trials for the Ray Tune tests of :mod:`workloads.training.sweep` that report set figures instead of training.

What Tune's scheduler does with a trial then depends on nothing but the figures. Each is a ``run_trial``
as :func:`workloads.training.sweep.run_sweep` calls it, importable by the Ray workers that run trials.
"""

from __future__ import annotations

from typing import Any

EPOCHS = 3


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


def stall_once_in_the_second_trial(values: dict[str, Any], name: str, trials_root: Any, callbacks: list[Any]) -> None:
    """:func:`report_the_learning_rate`, except that the trial of learning rate 0.8, the first time it runs, stops
    after its first epoch and waits to be killed (it touches ``$SWEEP_STALLED`` first). Every start of a trial is
    a line in ``$SWEEP_STARTS``."""
    import os
    import time
    from pathlib import Path

    from ray import tune

    with open(os.environ["SWEEP_STARTS"], "a") as starts:
        starts.write(name + "\n")
    stalled = Path(os.environ["SWEEP_STALLED"])
    if float(values["workload.train.lr"]) == 0.8 and not stalled.exists():
        tune.report({"epoch": 1, "val_accuracy": 0.8})
        stalled.touch()
        time.sleep(600)
    report_the_learning_rate(values, name, trials_root, callbacks)


SWEEP_DRIVER = """
import json, os, sys
import ray
ray.init(runtime_env={"env_vars": json.loads(os.environ["SWEEP_JOB_ENV"])})
from jobs.sweep import SweepSpec
from jobs.workload_contract import Demand
from tests.support.sweep_trials import EPOCHS, stall_once_in_the_second_trial
from workloads.storage import storage_path
from workloads.training.sweep import run_sweep

sweep = SweepSpec.model_validate({"metric": "val_accuracy", "mode": "max", "search": "grid", "max_concurrent": 1,
                                  "parameters": {"workload.train.lr": {"choice": [0.9, 0.8]}}})
outcome = run_sweep(sweep, stall_once_in_the_second_trial, storage_path(sys.argv[1]), Demand("training", 1, 1.0),
                    EPOCHS)
print("TRIALS " + json.dumps([[trial.name, trial.status, trial.epochs] for trial in outcome.trials]), flush=True)
"""
"""A job's driver that runs a sweep of :func:`stall_once_in_the_second_trial` under the run folder ``argv[1]``,
joining the Ray of ``RAY_ADDRESS`` with ``$SWEEP_JOB_ENV`` as its job's variables."""
