"""Parameters every Ray Train workload has: where its run lives, and how its workers are scaled and kept alive.

Imports only pydantic, so rayjobs validates a spec without ray or torch. A workload's
parameter model derives from :class:`TrainingRunParams` and its training section from
:class:`RayTrainSettings`, so the same keys mean the same thing in every workload.
"""

from __future__ import annotations

from typing import Any

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


class WorkerScaling(StrictModel):
    """How many Ray Train workers run the training loop, and what each reserves."""

    num_workers: PositiveInt = Field(2, description="Ray Train workers (processes).")
    cpus_per_worker: PositiveFloat = Field(1.0, description="CPUs reserved by each worker; also its torch threads.")
    use_gpu: bool = Field(False, description="Give each worker one GPU.")
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="Further Ray resources reserved by each worker (a GPU count here "
        "overrides use_gpu's one).")

    def worker_resources(self) -> dict[str, float]:
        """The resources one worker reserves: its CPUs, a GPU with ``use_gpu``, and ``resources_per_worker``."""
        resources = {"CPU": float(self.cpus_per_worker), **self.resources_per_worker}
        if self.use_gpu:
            resources.setdefault("GPU", 1.0)
        return resources

    def demand(self, phase: str, section: str) -> Demand:
        """These workers as ``phase`` of a workload's needs (:mod:`jobs.workload_contract`); ``section`` is where
        they are set in the workload's parameters (``train``)."""
        return Demand(phase, count=self.num_workers, cpus=float(self.cpus_per_worker), gpus=1 if self.use_gpu else 0,
                      resources=dict(self.resources_per_worker),
                      resources_parameter=f"{section}.resources_per_worker")

    def scaling_config(self):
        """Ray Train's ``ScalingConfig`` for these settings."""
        import ray.train

        return ray.train.ScalingConfig(num_workers=self.num_workers, use_gpu=self.use_gpu,
                                       resources_per_worker=self.worker_resources())


class RayTrainSettings(WorkerScaling):
    """Worker scaling, plus the checkpoints Ray Train keeps and the worker failures it survives."""

    max_failures: int = Field(2, ge=-1, description="Worker failures survived by restoring the latest checkpoint "
                              "(-1: no limit).")
    num_to_keep: PositiveInt = Field(2, description="Checkpoints kept, the best by the workload's validation "
                                     "accuracy (and the latest).")
