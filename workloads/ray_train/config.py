"""Parameters every Ray Train workload has: where its run lives, and how its workers are scaled and kept alive.

Imports only pydantic, so rayjobs validates a spec without ray or torch. A workload's
parameter model derives from :class:`TrainingRunParams` and its training section from
:class:`RayTrainSettings`, so the same keys mean the same thing in every workload.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from jobs.paths import SpecStoragePath
from jobs.strict import StrictModel
from jobs.worker_layout import AUTO_LEAST_CPUS, auto_cpus_per_worker
from jobs.workload_contract import Demand
from workloads import storage
from workloads.storage import StoragePath

RUN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def run_name_field(default: str) -> Any:
    """The ``run_name`` field with a workload's own default name."""
    return Field(default, pattern=RUN_NAME_PATTERN,
                 description="Ray Train run name; the same name resumes from its latest checkpoint.")


class TrainingRunParams(StrictModel):
    """A training run: its name and the folder its checkpoints and artifacts are kept under."""

    run_name: str = run_name_field("run")
    storage_path: SpecStoragePath = Field(
        "~/rayjobs-results", description="Where runs, checkpoints and artifacts are kept: a local folder or "
        "s3://BUCKET/PREFIX (credentials from the AWS_* variables in runtime_env.env_vars).")

    @property
    def storage_root(self) -> StoragePath:
        """``storage_path`` as a location: an absolute ``Path``, or an ``ObjectPath`` in S3."""
        return storage.resolved(self.storage_path)

    @property
    def run_location(self) -> str:
        """``<storage_path>/<run_name>`` as the spec gives it (for the client, which resolves nothing here)."""
        return f"{str(self.storage_path).rstrip('/')}/{self.run_name}"

    @property
    def run_dir(self) -> StoragePath:
        """The run's folder, ``<storage_path>/<run_name>``: an absolute ``Path``, or an ``ObjectPath`` in S3."""
        return self.storage_root / self.run_name


AUTO = "auto"
# Ray Train's elastic group is looked at for a resize this often while it trains: never, in effect (a year).
NEVER_RESIZE_WHILE_TRAINING_S = 365 * 24 * 3600.0


@dataclass(frozen=True)
class NodeCapacity:
    """One alive Ray node as the layout sees it: its CPUs and GPUs, and the CPUs already held on it."""

    node_id: str
    cpus: float
    gpus: float = 0.0
    held_cpus: float = 0.0  # the entrypoint's reservation, other jobs: not this run's to use

    @property
    def free_cpus(self) -> int:
        """Whole CPUs left on the node for this run's workers."""
        return max(0, int(self.cpus - self.held_cpus + 1e-9))


def within_grant(nodes: Sequence[NodeCapacity], cpus: float | None) -> list[NodeCapacity]:
    """``nodes`` with no more whole CPUs free, in all, than ``cpus`` (what the cluster's queue let this run's workers
    take; None: no cap). The CPUs past the grant read as held: the queue counts them as other jobs' to start."""
    if cpus is None:
        return list(nodes)
    left, capped = int(cpus + 1e-9), []
    for node in nodes:
        usable = min(node.free_cpus, left)
        left -= usable
        capped.append(NodeCapacity(node.node_id, node.cpus, node.gpus, node.cpus - usable))
    return capped


def shared_by(nodes: Sequence[NodeCapacity], trials: int) -> list[NodeCapacity]:
    """``nodes`` as one of ``trials`` runs at once sees them (a sweep's ``max_concurrent``): each node's free CPUs in
    as many whole shares, the rest held, so that an ``auto`` layout resolved once leaves room for the others."""
    if trials <= 1:
        return list(nodes)
    return [NodeCapacity(node.node_id, node.cpus, node.gpus, node.cpus - node.free_cpus // trials) for node in nodes]


class WorkerScaling(StrictModel):
    """How many Ray Train workers run the training loop, and what each reserves.

    ``auto`` (the default of both) is resolved on the cluster when training starts
    (:meth:`resolved_for`): on CPU one worker per node, with that node's free CPUs as its threads,
    since one process per node ran at 0.86x the bare step where two single-thread processes
    waiting on each other's all-reduce ran at 0.65x (``docs/benchmarks.md``); on GPUs one
    worker per GPU. An ``auto`` number of workers is a most, not a must: a node lost mid-run
    leaves training to go on with the workers the nodes left hold (:attr:`min_workers`).
    """

    num_workers: PositiveInt | Literal["auto"] = Field(
        AUTO, description="Ray Train workers (processes). auto: one per node on CPU, one per GPU with use_gpu.")
    cpus_per_worker: PositiveFloat | Literal["auto"] = Field(
        AUTO, description="CPUs reserved by each worker; also its torch threads. auto: the CPUs its node has "
        "free when training starts (with use_gpu: shared among the node's GPUs; with num_workers set: the free "
        "CPUs shared alike among them, as many each as still places them all), at least 1.")
    use_gpu: bool = Field(False, description="Give each worker one GPU.")
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="Further Ray resources reserved by each worker (a GPU count here "
        "overrides use_gpu's one).")
    placement: Literal["auto", "pack", "spread"] = Field(
        AUTO, description="How Ray places the workers: pack them on as few nodes as fit (all-reduce stays on one "
        "node where it can), or spread them over as many. auto: spread where the auto layout chose one worker "
        "per node, else pack.")
    min_workers: PositiveInt | Literal["auto"] = Field(
        AUTO, description="The fewest workers training goes on with when a node is lost mid-run: Ray Train's "
        "restart then takes as many workers as the nodes left hold, from min_workers up to num_workers, and resumes "
        "from the latest checkpoint with the same global batch. auto: 1 where num_workers is auto; num_workers where "
        "it is a number, so that a fixed layout waits for its nodes (a bounded time) and then fails.")

    @model_validator(mode="after")
    def _min_workers_within_num_workers(self) -> "WorkerScaling":
        if self.min_workers == AUTO:
            return self
        if self.num_workers == AUTO:
            raise ValueError("min_workers needs num_workers as a number to range up to; leave min_workers auto "
                             "with num_workers auto (training then goes on with as few as 1)")
        if self.min_workers > self.num_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is more than num_workers ({self.num_workers})")
        return self

    @property
    def layout_is_auto(self) -> bool:
        """Whether either of ``num_workers`` and ``cpus_per_worker`` is left for the cluster to decide."""
        return self.num_workers == AUTO or self.cpus_per_worker == AUTO

    def worker_resources(self) -> dict[str, float]:
        """The resources one worker reserves: its CPUs, a GPU with ``use_gpu``, and ``resources_per_worker``."""
        resources = {"CPU": float(self._cpus_or_least()), **self.resources_per_worker}
        if self.use_gpu:
            resources.setdefault("GPU", 1.0)
        return resources

    def demand(self, phase: str, section: str) -> Demand:
        """These workers as ``phase`` of a workload's needs (:mod:`jobs.workload_contract`); ``section`` is where
        they are set in the workload's parameters (``train``). An ``auto`` layout asks for the least it runs
        on: one worker of one CPU."""
        count = 1 if self.num_workers == AUTO else self.num_workers
        return Demand(phase, count=count, cpus=float(self._cpus_or_least()), gpus=1 if self.use_gpu else 0,
                      resources=dict(self.resources_per_worker),
                      resources_parameter=f"{section}.resources_per_worker",
                      auto_cpus=self.cpus_per_worker == AUTO, auto_count=self.num_workers == AUTO)

    def cpu_threads(self) -> int:
        """Torch threads of one worker: its reserved CPUs, or, where the layout was never resolved (the loop
        called outside ``run_training``), the CPUs this process may run on."""
        if self.cpus_per_worker == AUTO:
            return max(1, len(os.sched_getaffinity(0)))
        return max(1, int(self.cpus_per_worker))

    def _cpus_or_least(self) -> float:
        return float(AUTO_LEAST_CPUS) if self.cpus_per_worker == AUTO else float(self.cpus_per_worker)

    @property
    def fewest_workers(self) -> int | None:
        """``min_workers`` as a number (``num_workers`` for its ``auto``); None while ``num_workers`` is ``auto``."""
        if self.num_workers == AUTO:
            return None
        return self.num_workers if self.min_workers == AUTO else self.min_workers

    @property
    def is_elastic(self) -> bool:
        """Whether a restart may take fewer workers than ``num_workers`` (a resolved layout's range)."""
        fewest = self.fewest_workers
        return fewest is not None and fewest < self.num_workers

    def world_size_line(self, world_size: int, global_batch: int) -> str | None:
        """What training on ``world_size`` workers instead of the ``num_workers`` planned means for the batch; None
        when they are as many.

        The global batch is kept, and with it the learning rate and its schedule, which are set for it: each
        worker's share grows instead. A run resumed on fewer workers then follows the same recipe, only slower.
        """
        if self.num_workers == AUTO or world_size == self.num_workers:
            return None
        return (f"Training on {world_size} of the {self.num_workers} workers planned, as many as the nodes up hold: "
                f"the global batch stays {global_batch} images ({max(1, global_batch // world_size)} per worker), "
                "and so do the learning rate and its schedule")

    def resolved_for(self, nodes: Sequence[NodeCapacity], reserve_cpus_per_node: float = 0.0):
        """A copy with ``auto`` replaced by what fits ``nodes``, and one line saying which layout and why.

        ``reserve_cpus_per_node``: CPUs left free on every node for work beside the workers (Ray Data's
        decode tasks). Explicit values are kept as they are. On CPU, ``auto`` workers are one per node that
        has a whole CPU free, each with the fewest free CPUs among those nodes (Ray Train gives every worker
        the same reservation); a number of workers the spec sets shares the free CPUs alike
        (:func:`jobs.worker_layout.auto_cpus_per_worker`); with ``use_gpu``, one per GPU.
        """
        if not self.layout_is_auto:
            return self, (f"layout: {self.num_workers} worker(s) × {self.cpus_per_worker:g} CPU, as the spec sets")
        usable = [node for node in nodes if node.free_cpus - reserve_cpus_per_node >= 1]
        if self.use_gpu:
            usable = [node for node in usable if node.gpus >= 1] or usable
        if not usable:
            usable = list(nodes)[:1] or [NodeCapacity("", 1.0)]
        if self.use_gpu:
            gpus = int(sum(node.gpus for node in usable)) or 1
            workers = gpus if self.num_workers == AUTO else self.num_workers
            per_gpu = min(int((node.free_cpus - reserve_cpus_per_node) // max(1, node.gpus)) for node in usable)
            cpus = max(1, per_gpu) if self.cpus_per_worker == AUTO else self.cpus_per_worker
            why = f"one per GPU ({gpus} GPU(s))"
        elif self.num_workers == AUTO:
            workers = len(usable)
            least = min(int(node.free_cpus - reserve_cpus_per_node) for node in usable)
            cpus = max(AUTO_LEAST_CPUS, least) if self.cpus_per_worker == AUTO else self.cpus_per_worker
            share = ("the CPUs the spec sets" if self.cpus_per_worker != AUTO else
                     f"the {least:g} CPU(s) free on its node" + (f" less {reserve_cpus_per_node:g} for the data "
                                                                   "pipeline" if reserve_cpus_per_node else ""))
            why = f"one per node with a CPU free ({len(usable)} node(s)), each with {share}"
        else:
            # The spec's workers share the free CPUs alike, as many each as still places them all: a node's
            # whole share each would ask N nodes' worth of CPUs (two workers of 2 CPUs on a 2-CPU cluster).
            workers = self.num_workers
            free = [int(node.free_cpus - reserve_cpus_per_node) for node in usable]
            cpus = auto_cpus_per_worker(workers, free)
            why = (f"the spec's {workers} workers share the {sum(free):g} CPU(s) free on {len(usable)} node(s)"
                   + (f" (less {reserve_cpus_per_node:g} a node for the data pipeline)" if reserve_cpus_per_node
                      else ""))
        placement = self.placement
        if placement == AUTO:
            placement = "spread" if not self.use_gpu and self.num_workers == AUTO and workers > 1 else "pack"
        # An auto number of workers is the most a restart asks for: after a lost node, the workers the nodes left
        # hold go on (min_workers 1). A number the spec sets stays fixed unless min_workers says otherwise.
        fewest = 1 if self.num_workers == AUTO and self.min_workers == AUTO else self.min_workers
        # The resolved values are plain fields, so a copy rebuilt from its dump (a sweep's trial) places alike.
        resolved = self.model_copy(update={"num_workers": int(workers), "cpus_per_worker": float(cpus),
                                           "placement": placement, "min_workers": fewest})
        going_on = f"; fewer (down to {resolved.fewest_workers}) if a node is lost" if resolved.is_elastic else ""
        return resolved, f"layout: {workers} worker(s) × {cpus:g} CPU, auto: {why}{going_on}"

    def scaling_config(self):
        """Ray Train's ``ScalingConfig`` for these settings (an ``auto`` layout resolved first).

        A range of workers (:attr:`is_elastic`) becomes Ray Train's elastic ``(min, max)``, where Train V2 has it:
        a restart takes as many workers as the nodes up hold. The group never grows while it trains (a resize
        restarts it from the latest checkpoint, throwing the epoch in progress away): a node that comes back
        is used from the next restart or run on.
        """
        import ray.train

        from jobs.infra.ray_internals import train_v2_enabled

        if self.layout_is_auto:
            raise ValueError("resolve the auto layout on the cluster (resolved_for) before building its ScalingConfig")
        elastic = {}
        if self.is_elastic and train_v2_enabled():
            elastic = {"num_workers": (self.fewest_workers, self.num_workers),
                       "elastic_resize_monitor_interval_s": NEVER_RESIZE_WHILE_TRAINING_S}
        return ray.train.ScalingConfig(**{"num_workers": self.num_workers, "use_gpu": self.use_gpu,
                                          "resources_per_worker": self.worker_resources(),
                                          "placement_strategy": "SPREAD" if self.placement == "spread" else "PACK",
                                          **elastic})


class RayTrainSettings(WorkerScaling):
    """Worker scaling, plus the checkpoints Ray Train keeps and the worker failures it survives."""

    max_failures: int = Field(2, ge=-1, description="Worker failures survived by restoring the latest checkpoint "
                              "(-1: no limit).")
    num_to_keep: PositiveInt = Field(2, description="Checkpoints kept, the best by the workload's validation "
                                     "accuracy (and the latest).")
