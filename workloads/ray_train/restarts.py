"""How long a training run waits for the workers it asks for, after a lost node or at its start, before it fails.

Ray Train places a worker group by reserving a placement group and waiting for it, up to
``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (60 s by default) a try; a try that times out is a controller
failure, and Ray Train's own default allows any number of them. A fixed layout that the nodes left
after a loss cannot hold then waits for ever. So a run gets :data:`START_TRIES` tries, ten minutes by
default: time for an autoscaler to add a node, and for the view of the cluster an elastic restart reads
(refreshed every 20 s) to drop a node that is gone. Past them the attempt fails with its cause, and the
agent's retry in place (``retry_on``) or the user takes over.

An elastic group (a range of workers, :meth:`WorkerScaling.scaling_config`) has a second way to wait:
where the nodes up hold fewer workers than its minimum, Ray Train starts nothing, and tries again at once,
for ever, without a controller failure to count. :class:`PlacementGuard` bounds that wait by the same
time, and slows the controller's loop meanwhile. It implements Ray Train's own controller interface
(from :mod:`rayjobs_agent.ray_internals`); a Ray without it leaves the guard inert, never the run broken.

Imported where a run starts (:func:`workloads.ray_train.trainer.fit`), not with the trainer: it imports Ray.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rayjobs_agent.ray_internals import ControllerCallback, callback_bases

# Tries Ray Train gets at placing a worker group, over a run's life (a run's controller never resets the count).
START_TRIES = 10
# Ray Train's variable for the time each try waits, and its default.
START_TIMEOUT_ENV_VAR = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 60.0
# Ray Train's name for a try at placing a worker group that timed out.
START_TIMEOUT_ERROR = "WorkerGroupStartupTimeoutError"
# While an elastic group waits for nodes, the controller asks the cluster about them at most once a second.
WAIT_STEP_S = 1.0
# The controller states in which it decides on a worker group to start (its first, or after a failure).
_DECIDING_STATES = frozenset({"InitializingState", "RestartingState", "ReschedulingState"})


def start_timeout_s() -> float:
    """Seconds each try at placing a worker group waits, as Ray Train reads them (the driver's variable reaches
    the controller)."""
    try:
        return float(os.environ.get(START_TIMEOUT_ENV_VAR, DEFAULT_START_TIMEOUT_S))
    except ValueError:
        return DEFAULT_START_TIMEOUT_S


def patience_s() -> float:
    """How long a run waits for workers it can start before it fails: :data:`START_TRIES` tries' worth."""
    return START_TRIES * start_timeout_s()


class WorkersNotPlaced(RuntimeError):
    """The nodes up held too few workers for a run's minimum for longer than its patience."""


class PlacementGuard(*callback_bases(ControllerCallback)):  # type: ignore[misc]
    """Ends an elastic run's wait for the fewest workers it trains with, once it lasted :func:`patience_s`.

    Built on the driver and run in Ray Train's controller, where it sees every state the controller
    enters: a wait is the same deciding state entered again (Ray Train's answer to "not enough nodes"
    is to decide again).
    """

    def __init__(self, fewest_workers: int, resources_per_worker: dict[str, float]) -> None:
        self.fewest_workers = fewest_workers
        self.resources_per_worker = dict(resources_per_worker)
        self.waiting_since: float | None = None

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        """Time the wait that a deciding state entered again is, slow it down, and end it past the patience."""
        if current_state is not previous_state or type(current_state).__name__ not in _DECIDING_STATES:
            self.waiting_since = None
            return
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
        waited = now - self.waiting_since
        if waited >= patience_s():
            raise WorkersNotPlaced(
                f"the nodes up held fewer than {self.fewest_workers} worker(s) of {self.resources_per_worker} for "
                f"{waited:.0f} s ({START_TRIES} tries of {START_TIMEOUT_ENV_VAR}, {start_timeout_s():g} s)")
        # Ray Train decides again at once, in a loop that would hold a CPU and the controller's event loop.
        time.sleep(WAIT_STEP_S)


def placement_failure(innermost: BaseException) -> str | None:
    """A run's failure in words when its workers could not be placed (``innermost`` the error behind Ray's
    wrappers); None for any other failure."""
    if isinstance(innermost, WorkersNotPlaced):
        return f"{type(innermost).__name__}: {innermost}"
    if type(innermost).__name__ != START_TIMEOUT_ERROR:
        return None
    count = getattr(innermost, "num_workers", None)
    workers = f"{count} workers" if isinstance(count, int) else "the workers"
    return (f"{START_TIMEOUT_ERROR}: {workers} could not be placed in {START_TRIES} tries of {start_timeout_s():g} s "
            "each: the nodes up cannot hold them")
