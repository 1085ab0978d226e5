"""The Ray Train side of the progress channel: a callback Ray Train builds from ``RAY_TRAIN_CALLBACKS``.

It runs in the Train controller (one per ``TorchTrainer.fit``), which sees what no worker sees
alone: every report once all ranks have made it, each attempt's worker placement, and every failure
with the decision to restart or give up. Ray builds callbacks named in that variable as plain
``RayTrainCallback`` objects (the public ``UserCallback`` is only called for callbacks passed in
the script's ``RunConfig``), so this class implements Ray Train's own callback interfaces: the one
file on the cluster that depends on them.

It must never fail or slow the training it watches. Ray turns an exception in a callback's hook
into a failed run, and a callback it cannot import or build into a ``fit`` that raises, so:

- Ray's private interfaces are imported under a guard. Without them the class is still a
  ``RayTrainCallback`` (public, which Ray requires of every callback it builds from the variable),
  one that no hook of Ray's calls: the run goes on without progress.
- Every hook runs through :func:`guarded`: its first failure turns the callback off for the rest of
  the run, and is said once in the log (``rayjobs: progress unavailable: <reason>; the run goes on``)
  and as a ``progress_unavailable`` event, which the run record keeps.
- A Ray outside the versions it is tested on turns it off as it is built (the record keeper does
  not even name it then; a job that keeps no record meets the same check here).
"""

from __future__ import annotations

from typing import Any

from ..events import emit, plain_metrics
from ..guard import guarded, turn_off
from .install import is_tested, ray_version, tested_range_text
from ..vocabulary import EventKind

from ..ray_internals import INTERFACES_MISSING as _INTERFACES_MISSING
from ..ray_internals import ControllerCallback, ReportCallback, WorkerGroupCallback, callback_bases

_INTERFACES = callback_bases(ControllerCallback, WorkerGroupCallback, ReportCallback)

# Keys a training loop's config commonly names its length by; the first found gives the ETA its end.
EPOCH_KEYS = ("epochs", "num_epochs", "max_epochs", "n_epochs")
_REASON_CHARS = 2000


class ProgressCallback(*_INTERFACES):  # type: ignore[misc]
    """Turns a Ray Train run's life into progress events: start, attempts, reports, restarts, end."""

    def __init__(self) -> None:
        self.unavailable: str | None = None
        self.run_name: str | None = None
        self.epochs: int | None = None
        self.attempt = 0
        self.iteration = 0
        try:
            version = ray_version()
            if _INTERFACES_MISSING is not None:
                turn_off(self, _INTERFACES_MISSING)
            elif not is_tested(version):
                turn_off(self, f"the progress callback is tested on Ray {tested_range_text()} and this cluster "
                               f"runs Ray {version}")
        except Exception as exc:  # Ray builds this in the user's `fit`: nothing here may raise
            self.unavailable = f"{type(exc).__name__}: {exc}"

    @guarded
    def after_controller_start(self, train_run_context: Any) -> None:
        """A run starts: its name, planned epochs, workers and failure budget."""
        self.epochs = epochs = planned_epochs(train_run_context.train_loop_config or {})
        run_config = train_run_context.run_config
        failure_config = getattr(run_config, "failure_config", None)
        scaling = train_run_context.scaling_config
        self.run_name = run_config.name
        use_gpu = bool(getattr(scaling, "use_gpu", False))
        # Ray Train's own default when a run names none: one CPU per worker, or one GPU with use_gpu.
        per_worker = getattr(scaling, "resources_per_worker", None) or ({"GPU": 1} if use_gpu else {"CPU": 1})
        # An elastic run's num_workers is a (min, max) range: the most it asks for is what it plans.
        emit(EventKind.TRAIN_START, run=self.run_name, epochs=epochs,
             workers=getattr(scaling, "max_workers", None) or getattr(scaling, "num_workers", None), use_gpu=use_gpu,
             resources_per_worker={str(name): float(amount) for name, amount in dict(per_worker).items()},
             max_failures=getattr(failure_config, "max_failures", None))

    @guarded
    def after_worker_group_start(self, worker_group: Any) -> None:
        """An attempt has its workers: where each rank runs, and the cluster it runs on."""
        self.attempt += 1
        placement = []
        for worker in worker_group.get_workers():
            context = worker.distributed_context
            placement.append({"rank": context.world_rank if context else None, "node_id": worker.metadata.node_id,
                              "node_ip": worker.metadata.node_ip, "pid": worker.metadata.pid,
                              "gpu_ids": list(getattr(worker.metadata, "gpu_ids", None) or [])})
        placement.sort(key=lambda entry: (entry["rank"] is None, entry["rank"]))
        emit(EventKind.ATTEMPT, run=self.run_name, attempt=self.attempt, workers=placement,
             nodes=len({entry["node_id"] for entry in placement}), cluster=cluster_shape())

    @guarded
    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        """All ranks reported: rank 0's metrics, the iteration, whether a checkpoint came with it."""
        self.iteration += 1
        # The planned length rides on every report, so that the end of a long log alone tells the ETA.
        emit(EventKind.REPORT, run=self.run_name, attempt=self.attempt, iteration=self.iteration, epochs=self.epochs,
             metrics=plain_metrics(metrics[0] if metrics else {}), checkpoint=training_report.checkpoint is not None)

    @guarded
    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        """A restart (with its reason), or the run's end."""
        state = type(current_state).__name__.removesuffix("State").upper()
        error = getattr(current_state, "training_failed_error", None)
        # A state entered again is Ray Train deciding again (an elastic run waiting for nodes): no new restart.
        if state in ("RESTARTING", "RESCHEDULING") and current_state is not previous_state:
            emit(EventKind.RESTART, run=self.run_name, attempt=self.attempt, reason=_reason(error))
        elif state in ("ERRORED", "FINISHED", "ABORTED"):
            emit(EventKind.TRAIN_END, run=self.run_name, state=state, attempts=self.attempt, iterations=self.iteration,
                 reason=_reason(error) if error is not None else None)


def cluster_shape() -> dict[str, Any] | None:
    """The cluster this attempt runs on: nodes alive, CPUs and GPUs in all (for the run record)."""
    import ray

    try:
        resources = ray.cluster_resources()
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    except Exception:  # a GCS that does not answer must not stop training; the record then lacks the shape
        return None
    return {"nodes": nodes, "cpus": resources.get("CPU", 0), "gpus": resources.get("GPU", 0)}


def planned_epochs(config: dict[str, Any], depth: int = 2) -> int | None:
    """How many epochs a training loop's config asks for: a key of :data:`EPOCH_KEYS` at its top level,
    else in a dict nested up to ``depth`` levels down (``{"train": {"epochs": 12}}``); None when it names none."""
    found = next((config[key] for key in EPOCH_KEYS if isinstance(config.get(key), int)
                  and not isinstance(config.get(key), bool)), None)
    if found is not None or depth == 0:
        return found
    nested = (planned_epochs(value, depth - 1) for value in config.values() if isinstance(value, dict))
    return next((epochs for epochs in nested if epochs is not None), None)


def _reason(error: Any) -> str:
    """A failure in a few lines: Ray's error wraps each worker's traceback; its last line names the cause."""
    if error is None:
        return "unknown"
    text = str(error).strip()
    return text[-_REASON_CHARS:] if len(text) > _REASON_CHARS else text
