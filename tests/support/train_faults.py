"""A training worker that dies, or holds still, mid-run, for the tests of recovery from a checkpoint.

Ray runs :func:`install` in every worker process of a Ray instance (or a job) started with
``runtime_env={"worker_process_setup_hook": SETUP_HOOK}``. In a process whose environment
names an epoch index in ``RAYJOBS_TEST_FAIL_AT_EPOCH``, it wraps the training loop's
``train_one_epoch`` so that one rank exits at the start of that epoch, once per run
(a marker file in the run directory remembers it); with ``RAYJOBS_TEST_HOLD_AT_EPOCH``,
rank 0 stops at the start of that epoch instead, once per run, until its process is ended
(a test that kills a node finds training there, not finished). Every other process is left
alone, and the training loop is patched only in a process that imports it: a job-wide
variable costs Ray Data's tasks nothing. :func:`fail_workers_at_epoch` puts the first
variable into the environment of the training workers of the runs a test starts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

FAIL_AT_EPOCH_ENV_VAR = "RAYJOBS_TEST_FAIL_AT_EPOCH"
HOLD_AT_EPOCH_ENV_VAR = "RAYJOBS_TEST_HOLD_AT_EPOCH"
SETUP_HOOK = "tests.support.train_faults.install"
FAIL_MARKER = ".test-fail-marker"
# Written by the holding rank once training stands still: a test waits for it before it strikes.
HOLD_MARKER = ".test-hold-marker"
LOOP_MODULE = "workloads.vision.training.loop"
# A hold that nothing ends gives up, and training goes on: the test then fails on what it checks, not by hanging.
HOLD_GUARD_S = 600.0


def install() -> None:
    """Ray's worker_process_setup_hook: arm the failure or the hold in a training worker that was asked for one."""
    fail_at = os.environ.get(FAIL_AT_EPOCH_ENV_VAR, "")
    hold_at = os.environ.get(HOLD_AT_EPOCH_ENV_VAR, "")
    if not fail_at and not hold_at:
        return

    def patch(loop) -> None:
        train_one_epoch = loop.train_one_epoch

        def train_one_epoch_with_faults(worker, epoch: int):
            if fail_at:
                exit_once_at(worker, epoch, int(fail_at))
            if hold_at:
                hold_once_at(worker, epoch, int(hold_at))
            return train_one_epoch(worker, epoch)

        loop.train_one_epoch = train_one_epoch_with_faults

    if fail_at or LOOP_MODULE in sys.modules:
        # fail_workers_at_epoch names the training workers alone: they import the loop anyway.
        from workloads.vision.training import loop

        patch(loop)
    else:
        sys.meta_path.insert(0, _PatchOnImport(LOOP_MODULE, patch))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches one module right after it is first imported, so a process that never imports it pays nothing."""

    def __init__(self, name: str, patch) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname, path, target=None):
        """The module's own spec, its loader wrapped to patch the module once it has run."""
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module) -> None:
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def _wait_for_previous_checkpoint(worker, epoch: int) -> None:
    """Wait until epoch index ``epoch - 1``'s checkpoint is registered, so that the run recovers from it.

    The controller collects reports every couple of seconds; a worker that stops right
    after a report can lose that report's checkpoint.
    """
    snapshot = worker.run_dir / "checkpoint_manager_snapshot.json"
    previous = f"checkpoint_epoch_{epoch:04d}"
    deadline = time.monotonic() + 60
    while epoch > 0 and time.monotonic() < deadline:
        if snapshot.exists() and previous in snapshot.read_text(encoding="utf-8"):
            break
        time.sleep(0.2)


def _first_strike(worker, epoch: int, strike_at: int, rank: int, marker_name: str, what: str) -> bool:
    """Whether this process strikes now: it is ``rank`` at epoch index ``strike_at`` and the run was not struck yet.

    Before it says yes, it waits for the previous epoch's checkpoint and leaves the marker that
    tells the run's later attempts that the strike has happened.
    """
    from workloads.vision.training.loop import say

    if epoch != strike_at or worker.rank != rank:
        return False
    marker = worker.run_dir / marker_name
    if marker.exists():
        return False
    _wait_for_previous_checkpoint(worker, epoch)
    marker.write_text(f"worker of rank {worker.rank} {what} at epoch index {epoch}\n", encoding="utf-8")
    say(f"[test hook] rank {worker.rank} {what} at the start of epoch index {epoch}")
    return True


def exit_once_at(worker, epoch: int, fail_at: int) -> None:
    """End this process when it is rank 1 (rank 0 alone) at epoch index ``fail_at`` and the run has not failed yet."""
    if _first_strike(worker, epoch, fail_at, min(1, worker.world_size - 1), FAIL_MARKER, "exited"):
        os._exit(1)


def hold_once_at(worker, epoch: int, hold_at: int) -> None:
    """Stand still when this is rank 0 at epoch index ``hold_at`` and the run has not held yet.

    The other ranks go on into the epoch and wait for rank 0 in its first collective, so no
    rank finishes the epoch: the run stays where its latest checkpoint is until something
    (a lost node) ends the attempt. The next attempt of the run finds the marker and trains on.
    """
    if not _first_strike(worker, epoch, hold_at, 0, HOLD_MARKER, "held"):
        return
    deadline = time.monotonic() + HOLD_GUARD_S
    while time.monotonic() < deadline:
        time.sleep(0.5)


def fail_workers_at_epoch(monkeypatch, epoch: int) -> None:
    """Make the training runs started in this test lose one worker at the start of epoch index ``epoch``.

    Ray Train starts its workers with ``RunConfig.worker_runtime_env``; the variable set
    there reaches :func:`install` in those processes only.
    """
    from workloads.ray_train import trainer

    run_config = trainer.run_config

    def run_config_with_failure(*args, **kwargs):
        config = run_config(*args, **kwargs)
        config.worker_runtime_env = {"env_vars": {FAIL_AT_EPOCH_ENV_VAR: str(epoch)}}
        return config

    monkeypatch.setattr(trainer, "run_config", run_config_with_failure)
