"""A training worker that dies mid-run, for the tests of recovery from a checkpoint.

Ray runs :func:`install` in every worker process of a Ray instance started with
``runtime_env={"worker_process_setup_hook": SETUP_HOOK}``. In a process whose environment
names an epoch index in ``RAYJOBS_TEST_FAIL_AT_EPOCH``, it wraps the training loop's
``train_one_epoch`` so that one rank exits at the start of that epoch, once per run
(a marker file in the run directory remembers it); every other process is left alone.
:func:`fail_workers_at_epoch` puts that variable into the environment of the training
workers of the runs a test starts.
"""

from __future__ import annotations

import os
import time

FAIL_AT_EPOCH_ENV_VAR = "RAYJOBS_TEST_FAIL_AT_EPOCH"
SETUP_HOOK = "tests.support.train_faults.install"
FAIL_MARKER = ".test-fail-marker"


def install() -> None:
    """Ray's worker_process_setup_hook: arm the failure in a training worker that was asked for one."""
    fail_at = os.environ.get(FAIL_AT_EPOCH_ENV_VAR, "")
    if not fail_at:
        return
    from workloads.vision.training import loop

    train_one_epoch = loop.train_one_epoch

    def train_one_epoch_or_exit(worker, epoch: int):
        exit_once_at(worker, epoch, int(fail_at))
        return train_one_epoch(worker, epoch)

    loop.train_one_epoch = train_one_epoch_or_exit


def exit_once_at(worker, epoch: int, fail_at: int) -> None:
    """End this process when it is rank 1 (rank 0 alone) at epoch index ``fail_at`` and the run has not failed yet."""
    from workloads.vision.training.loop import say

    if epoch != fail_at or worker.rank != min(1, worker.world_size - 1):
        return
    marker = worker.run_dir / FAIL_MARKER
    if marker.exists():
        return
    # The controller collects reports every couple of seconds; a worker dying right
    # after a report can lose that report's checkpoint. Wait until the previous
    # epoch's checkpoint is registered, so the failure exercises recovery from it.
    snapshot = worker.run_dir / "checkpoint_manager_snapshot.json"
    previous = f"checkpoint_epoch_{epoch:04d}"
    deadline = time.monotonic() + 60
    while epoch > 0 and time.monotonic() < deadline:
        if snapshot.exists() and previous in snapshot.read_text(encoding="utf-8"):
            break
        time.sleep(0.2)
    marker.write_text(f"worker of rank {worker.rank} exited at epoch index {epoch}\n", encoding="utf-8")
    say(f"[test hook] rank {worker.rank} exits at the start of epoch index {epoch}")
    os._exit(1)


def fail_workers_at_epoch(monkeypatch, epoch: int) -> None:
    """Make the training runs started in this test lose one worker at the start of epoch index ``epoch``.

    Ray Train starts its workers with ``RunConfig.worker_runtime_env``; the variable set
    there reaches :func:`install` in those processes only.
    """
    from workloads.training import trainer

    run_config = trainer.run_config

    def run_config_with_failure(*args, **kwargs):
        config = run_config(*args, **kwargs)
        config.worker_runtime_env = {"env_vars": {FAIL_AT_EPOCH_ENV_VAR: str(epoch)}}
        return config

    monkeypatch.setattr(trainer, "run_config", run_config_with_failure)
