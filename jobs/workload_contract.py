"""What a workload tells the client about itself, so the client never reads a workload's fields by name.

A workload's parameter model (see :mod:`jobs.workload_kinds`) may define ``needs()`` returning
:class:`WorkloadNeeds`: the program its job runs, the locations every node of the job reads or
writes, and the resources each phase asks for. The client uses it to warn about local paths on a
multi-node cluster, to size a KubeRay worker group, to check a spec's entrypoint, and to keep the
run's record in the run's own folder. A model
without ``needs()`` declares nothing, and the client makes no guess about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Demand:
    """One phase of a workload (training, inference) and the resources it asks Ray for."""

    phase: str
    count: int  # workers or actors, running at once
    cpus: float  # per worker
    gpus: int = 0  # per worker
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per worker
    resources_parameter: str | None = None  # where the workload's parameters set them, for messages
    # ``cpus`` is the least an auto count gives a worker (jobs.worker_layout.AUTO_LEAST_CPUS): it may give more.
    auto_cpus: bool = False
    # ``count`` is the least an auto number of workers runs on: it takes one a node (a GPU) of what is free.
    auto_count: bool = False

    @property
    def grows(self) -> tuple[str, ...]:
        """The resources this phase takes more of than it asks, when more are free (an ``auto`` layout's)."""
        if not (self.auto_cpus or self.auto_count):
            return ()
        return ("CPU", "GPU") if self.gpus and self.auto_count else ("CPU",)


@dataclass(frozen=True)
class WorkloadNeeds:
    """What the client needs to know about a workload, declared by its parameter model."""

    entrypoint_module: str | None = None  # the module its job runs: ``python -m MODULE``
    shared_locations: dict[str, str] = field(default_factory=dict)  # parameter -> local path or URI, as given
    demands: tuple[Demand, ...] = ()  # in the order the phases run
    run_location: str | None = None  # the run's own folder (local path or URI, as given): its record goes there
    sweepable: tuple[str, ...] = ()  # sections whose fields a sweep may change (``train``); none: no sweeps
    metrics: tuple[str, ...] = ()  # what it reports per epoch: what a sweep can choose by
    epochs: int | None = None  # how many epochs its training runs (a sweep's trials at most that)


@runtime_checkable
class DeclaresNeeds(Protocol):
    """A workload parameter model that follows the contract."""

    def needs(self) -> WorkloadNeeds:
        """What this workload, with these parameters, needs from the client and the cluster."""
        ...


def workload_needs(workload: Any) -> WorkloadNeeds:
    """The needs ``workload`` (a validated parameter model, or None) declares; nothing for a model without ``needs()``."""
    if isinstance(workload, DeclaresNeeds):
        return workload.needs()
    return WorkloadNeeds()
