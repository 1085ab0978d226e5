"""A spec's place in a cluster queue: its queue, its priority, and what it will use once it starts.

The queue itself runs on the cluster (``rayjobs_agent/queueing.py``): this module only says
what the job's wrapper is told, and what the client checks before submitting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayjobs_agent.wire import METADATA_PRIORITY, METADATA_QUEUE
from jobs.workload_contract import workload_needs

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec



def queue_needs(loaded: LoadedSpec) -> dict[str, float]:
    """What the job will use while it runs, in Ray's resource names.

    The spec's ``needs`` when given; else the widest of the workload's stages (its workers or actors run
    at once, one stage after another) plus the entrypoint's own resources. A user's script that names
    no ``needs`` counts its entrypoint's resources only.
    """
    spec = loaded.spec
    if spec.needs is not None:
        return {name: float(amount) for name, amount in spec.needs.items() if amount > 0}
    widest: dict[str, float] = {}
    for demand in workload_needs(loaded.workload).demands:
        stage = {"CPU": demand.count * demand.cpus, "GPU": float(demand.count * demand.gpus),
                 **{name: demand.count * amount for name, amount in demand.resources.items()}}
        for name, amount in stage.items():
            widest[name] = max(widest.get(name, 0.0), float(amount))
    entrypoint = {"CPU": spec.entrypoint_num_cpus or 0, "GPU": spec.entrypoint_num_gpus or 0,
                  **(spec.entrypoint_resources or {})}
    for name, amount in entrypoint.items():
        widest[name] = widest.get(name, 0.0) + float(amount)
    return {name: amount for name, amount in widest.items() if amount > 0}


def queue_grows(loaded: LoadedSpec) -> list[str]:
    """The resources the job takes more of than its needs say, when more are free: an ``auto`` layout takes the
    CPUs free when it starts. The queue lets it in with all it may take (its grant), counts that as its own, and
    the workload's layout keeps within it. A spec that names its ``needs`` takes what it names."""
    if loaded.spec.needs is not None:
        return []
    grows = {name for demand in workload_needs(loaded.workload).demands for name in demand.grows}
    return sorted(grows)


def queue_config(loaded: LoadedSpec) -> dict[str, Any] | None:
    """What the job's wrapper needs to wait its turn (None for a job in no queue)."""
    spec = loaded.spec
    if spec.queue is None:
        return None
    return {"name": spec.queue, "priority": spec.priority, "needs": queue_needs(loaded), "grows": queue_grows(loaded)}


def queue_metadata(loaded: LoadedSpec) -> dict[str, str]:
    """Job metadata that lets ``rayjobs list`` and ``rayjobs queue`` find a job's queue in Ray's job table."""
    spec = loaded.spec
    if spec.queue is None:
        return {}
    return {METADATA_QUEUE: spec.queue, METADATA_PRIORITY: str(spec.priority)}
