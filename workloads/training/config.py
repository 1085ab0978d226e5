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

from pydantic import Field, PositiveFloat, PositiveInt

from jobs.paths import SpecStoragePath
from jobs.strict import StrictModel
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


class WorkerScaling(StrictModel):
    """How many Ray Train workers run the training loop, and what each reserves.

    ``auto`` (the default of both) is resolved on the cluster when training starts
    (:meth:`resolved_for`): on CPU one worker per node, with that node's free CPUs as its threads,
    since one process per node ran at 0.86x the bare step where two single-thread processes
    waiting on each other's all-reduce ran at 0.65x (``docs/benchmarks.md``); on GPUs one
    worker per GPU.
    """

    num_workers: PositiveInt | Literal["auto"] = Field(
        AUTO, description="Ray Train workers (processes). auto: one per node on CPU, one per GPU with use_gpu.")
    cpus_per_worker: PositiveFloat | Literal["auto"] = Field(
        AUTO, description="CPUs reserved by each worker; also its torch threads. auto: the CPUs its node has "
        "free when training starts (with use_gpu: shared among the node's GPUs).")
    use_gpu: bool = Field(False, description="Give each worker one GPU.")
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="Further Ray resources reserved by each worker (a GPU count here "
        "overrides use_gpu's one).")
    placement: Literal["auto", "pack", "spread"] = Field(
        AUTO, description="How Ray places the workers: pack them on as few nodes as fit (all-reduce stays on one "
        "node where it can), or spread them over as many. auto: spread where the auto layout chose one worker "
        "per node, else pack.")

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
                      resources_parameter=f"{section}.resources_per_worker")

    def cpu_threads(self) -> int:
        """Torch threads of one worker: its reserved CPUs, or, where the layout was never resolved (the loop
        called outside ``run_training``), the CPUs this process may run on."""
        if self.cpus_per_worker == AUTO:
            return max(1, len(os.sched_getaffinity(0)))
        return max(1, int(self.cpus_per_worker))

    def _cpus_or_least(self) -> float:
        return 1.0 if self.cpus_per_worker == AUTO else float(self.cpus_per_worker)

    def resolved_for(self, nodes: Sequence[NodeCapacity], reserve_cpus_per_node: float = 0.0):
        """A copy with ``auto`` replaced by what fits ``nodes``, and one line saying which layout and why.

        ``reserve_cpus_per_node``: CPUs left free on every node for work beside the workers (Ray Data's
        decode tasks). Explicit values are kept as they are. On CPU, ``auto`` workers are one per node that
        has a whole CPU free, each with the fewest free CPUs among those nodes (Ray Train gives every worker
        the same reservation); with ``use_gpu``, one per GPU.
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
        else:
            workers = len(usable) if self.num_workers == AUTO else self.num_workers
            least = min(int(node.free_cpus - reserve_cpus_per_node) for node in usable)
            cpus = max(1, least) if self.cpus_per_worker == AUTO else self.cpus_per_worker
            share = ("the CPUs the spec sets" if self.cpus_per_worker != AUTO else
                     f"the {least:g} CPU(s) free on its node" + (f" less {reserve_cpus_per_node:g} for the data "
                                                                   "pipeline" if reserve_cpus_per_node else ""))
            why = f"one per node with a CPU free ({len(usable)} node(s)), each with {share}"
        placement = self.placement
        if placement == AUTO:
            placement = "spread" if not self.use_gpu and self.num_workers == AUTO and workers > 1 else "pack"
        # The resolved values are plain fields, so a copy rebuilt from its dump (a sweep's trial) places alike.
        resolved = self.model_copy(update={"num_workers": int(workers), "cpus_per_worker": float(cpus),
                                           "placement": placement})
        return resolved, f"layout: {workers} worker(s) × {cpus:g} CPU, auto: {why}"

    def scaling_config(self):
        """Ray Train's ``ScalingConfig`` for these settings (an ``auto`` layout resolved first)."""
        import ray.train

        if self.layout_is_auto:
            raise ValueError("resolve the auto layout on the cluster (resolved_for) before building its ScalingConfig")
        return ray.train.ScalingConfig(num_workers=self.num_workers, use_gpu=self.use_gpu,
                                       resources_per_worker=self.worker_resources(),
                                       placement_strategy="SPREAD" if self.placement == "spread" else "PACK")


class RayTrainSettings(WorkerScaling):
    """Worker scaling, plus the checkpoints Ray Train keeps and the worker failures it survives."""

    max_failures: int = Field(2, ge=-1, description="Worker failures survived by restoring the latest checkpoint "
                              "(-1: no limit).")
    num_to_keep: PositiveInt = Field(2, description="Checkpoints kept, the best by the workload's validation "
                                     "accuracy (and the latest).")
