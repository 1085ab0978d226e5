"""Fitting a ``TorchTrainer``: the run's configuration, and Ray Train's wrapped errors turned into one line."""

from __future__ import annotations

import os
from typing import Any, Callable

from workloads import storage
from workloads.storage import StoragePath
from workloads.ray_train.config import NodeCapacity, RayTrainSettings, WorkerScaling, shared_by, within_grant


class TrainingError(RuntimeError):
    """Training cannot start or did not finish; the message says why."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters ('' for an empty message)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""


def innermost(exc: BaseException) -> BaseException:
    """The error behind Ray Train's wrappers: a worker's, or the controller's (which reaches the driver pickled,
    its cause kept only as ``controller_failure``)."""
    seen = set()
    while True:
        inner = exc.__cause__ or getattr(exc, "cause", None) or getattr(exc, "controller_failure", None) \
            or exc.__context__
        nested = getattr(exc, "worker_failures", None)
        if isinstance(nested, dict) and nested:
            inner = next(iter(nested.values()))
        if inner is None or id(inner) in seen or not isinstance(inner, BaseException):
            return exc
        seen.add(id(exc))
        exc = inner


def root_cause(exc: BaseException) -> str:
    """The innermost error behind Ray Train's wrappers, as ``Type: last line of its message``."""
    exc = innermost(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


def cluster_capacity() -> list[NodeCapacity]:
    """The alive nodes of the connected cluster with CPUs, as :meth:`WorkerScaling.resolved_for` reads them.

    Ray's public API gives what is free for the cluster as a whole, not per node: what is held now
    (the entrypoint's reservation, other jobs) is counted on this process's node, where the
    entrypoint runs.
    """
    import ray

    here = ray.get_runtime_context().get_node_id()
    held = max(0.0, ray.cluster_resources().get("CPU", 0.0) - ray.available_resources().get("CPU", 0.0))
    nodes = []
    for node in ray.nodes():
        resources = node.get("Resources") or {}
        if node.get("Alive") and resources.get("CPU", 0) > 0:
            nodes.append(NodeCapacity(node["NodeID"], float(resources["CPU"]), float(resources.get("GPU", 0)),
                                      held if node["NodeID"] == here else 0.0))
    # This node first: with a grant smaller than the cluster, the workers it holds go where the entrypoint runs.
    nodes.sort(key=lambda node: node.node_id != here)
    return within_grant(nodes, queue_grant().get("CPU"))


def queue_grant() -> dict[str, float]:
    """What the cluster's queue let this job's workers take (its admission's ``granted``); empty for a job that came
    through no queue, or was let in for what it declared."""
    from rayjobs_agent.queueing import Admission

    try:
        admission = Admission.from_environment(os.environ)
    except (ValueError, TypeError, KeyError):
        return {}
    return dict(admission.granted) if admission is not None else {}


def resolved_layout(settings: WorkerScaling, reserve_cpus_per_node: float = 0.0, trials_at_once: int = 1) -> WorkerScaling:
    """``settings`` with an ``auto`` layout resolved on the connected cluster; prints which layout and why.

    ``trials_at_once``: the runs that share the cluster (a sweep's ``max_concurrent``), each given its share.
    """
    if not settings.layout_is_auto:
        return settings
    resolved, line = settings.resolved_for(shared_by(cluster_capacity(), trials_at_once), reserve_cpus_per_node)
    print(line[0].upper() + line[1:], flush=True)
    return resolved


def run_config(storage_root: StoragePath, run_name: str, settings: RayTrainSettings, score_attribute: str,
               callbacks: list[Any] | None = None, score_order: str = "max"):
    """``RunConfig`` of run ``run_name`` kept under ``storage_root``: the best ``num_to_keep`` checkpoints by
    ``score_attribute`` (higher is better, or lower with ``score_order="min"``), ``max_failures`` worker
    failures survived, a bounded number of tries at placing the workers, and ``callbacks``.

    In S3, Ray Train is given the bucket's filesystem and the path on it (``bucket/prefix``).
    """
    import ray.train

    from jobs.infra.ray_internals import train_v2_enabled
    from workloads.ray_train.restarts import START_TRIES

    path, filesystem = storage.arrow_path(storage_root)
    # Train V2 retries a worker group that could not be placed for ever by default: a run gets START_TRIES.
    bounded = {"controller_failure_limit": START_TRIES - 1} if train_v2_enabled() else {}
    return ray.train.RunConfig(
        name=run_name,
        storage_path=path,
        storage_filesystem=filesystem,
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=settings.num_to_keep,
                                                     checkpoint_score_attribute=score_attribute,
                                                     checkpoint_score_order=score_order),
        failure_config=ray.train.FailureConfig(max_failures=settings.max_failures, **bounded),
        callbacks=callbacks,
    )


def fit(train_loop: Callable[[dict], Any], loop_config: dict, storage_root: StoragePath, run_name: str,
        settings: RayTrainSettings, score_attribute: str, callbacks: list[Any] | None = None,
        score_order: str = "max", **trainer_options: Any):
    """Run ``train_loop`` on ``settings.num_workers`` Ray Train workers as run ``run_name`` under ``storage_root``
    (``<storage_root>/<run_name>`` holds its checkpoints), and return the ``Result``.

    ``callbacks`` go to its ``RunConfig`` (a sweep's ``TuneReportCallback``), and the checkpoints it keeps are
    the best by ``score_attribute`` in ``score_order`` (a sweep's metric and mode); ``trainer_options`` to
    ``TorchTrainer`` as they are (``datasets``, ``dataset_config``). A range of workers (an ``auto`` layout's)
    restarts on the nodes left after one is lost, and waits no longer for nodes than a fixed layout does
    (:mod:`workloads.ray_train.restarts`).
    Raises :class:`TrainingError` naming the run and the root cause when the run fails.
    """
    from ray.train.torch import TorchTrainer

    from workloads.ray_train.restarts import PlacementGuard

    scaling = settings.scaling_config()
    if getattr(scaling, "elasticity_enabled", False):
        callbacks = [*(callbacks or []), PlacementGuard(scaling.min_workers, settings.worker_resources())]
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=loop_config,
        scaling_config=scaling,
        run_config=run_config(storage_root, run_name, settings, score_attribute, callbacks, score_order),
        **trainer_options,
    )
    try:
        result = trainer.fit()
    except Exception as exc:  # noqa: BLE001 - Ray wraps worker errors; show the root cause once
        raise TrainingError(f"training run {run_name!r} failed: {failure_text(exc)}") from None
    if getattr(result, "error", None) is not None:
        raise TrainingError(f"training run {run_name!r} failed: {failure_text(result.error)}")
    return result


def failure_text(exc: BaseException) -> str:
    """Why a run failed, in one line: workers that could not be placed in words, else the root cause."""
    from workloads.ray_train.restarts import placement_failure

    return placement_failure(innermost(exc)) or root_cause(exc)
