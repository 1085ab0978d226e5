"""The Ray Train side of the progress channel: a callback Ray Train builds from ``RAY_TRAIN_CALLBACKS``.

It runs in the Train controller (one per ``TorchTrainer.fit``), which sees what no worker sees
alone: every report once all ranks have made it, each attempt's worker placement, and every failure
with the decision to restart or give up. Ray builds callbacks named in that variable as plain
``RayTrainCallback`` objects (the public ``UserCallback`` is only called for callbacks passed in
the script's ``RunConfig``), so this class implements Ray Train's own callback interfaces: the one
file on the cluster that depends on them.
"""

from __future__ import annotations

from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerGroupCallback

from .events import emit, plain_metrics

# Keys a training loop's config commonly names its length by; the first found gives the ETA its end.
EPOCH_KEYS = ("epochs", "num_epochs", "max_epochs", "n_epochs")
_REASON_CHARS = 2000


class ProgressCallback(ControllerCallback, WorkerGroupCallback, ReportCallback):
    """Turns a Ray Train run's life into progress events: start, attempts, reports, restarts, end."""

    def __init__(self) -> None:
        self.run_name: str | None = None
        self.epochs: int | None = None
        self.attempt = 0
        self.iteration = 0

    def after_controller_start(self, train_run_context: Any) -> None:
        self.epochs = epochs = planned_epochs(train_run_context.train_loop_config or {})
        run_config = train_run_context.run_config
        failure_config = getattr(run_config, "failure_config", None)
        scaling = train_run_context.scaling_config
        self.run_name = run_config.name
        emit("train_start", run=self.run_name, epochs=epochs,
             workers=getattr(scaling, "num_workers", None), use_gpu=bool(getattr(scaling, "use_gpu", False)),
             max_failures=getattr(failure_config, "max_failures", None))

    def after_worker_group_start(self, worker_group: Any) -> None:
        self.attempt += 1
        placement = []
        for worker in worker_group.get_workers():
            context = worker.distributed_context
            placement.append({"rank": context.world_rank if context else None, "node_id": worker.metadata.node_id,
                              "node_ip": worker.metadata.node_ip, "pid": worker.metadata.pid,
                              "gpu_ids": list(getattr(worker.metadata, "gpu_ids", None) or [])})
        placement.sort(key=lambda entry: (entry["rank"] is None, entry["rank"]))
        emit("attempt", run=self.run_name, attempt=self.attempt, workers=placement,
             nodes=len({entry["node_id"] for entry in placement}), cluster=cluster_shape())

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        self.iteration += 1
        # The planned length rides on every report, so that the end of a long log alone tells the ETA.
        emit("report", run=self.run_name, attempt=self.attempt, iteration=self.iteration, epochs=self.epochs,
             metrics=plain_metrics(metrics[0] if metrics else {}), checkpoint=training_report.checkpoint is not None)

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        state = type(current_state).__name__.removesuffix("State").upper()
        error = getattr(current_state, "training_failed_error", None)
        if state in ("RESTARTING", "RESCHEDULING"):
            emit("restart", run=self.run_name, attempt=self.attempt, reason=_reason(error))
        elif state in ("ERRORED", "FINISHED", "ABORTED"):
            emit("train_end", run=self.run_name, state=state, attempts=self.attempt, iterations=self.iteration,
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
