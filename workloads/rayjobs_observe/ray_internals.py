"""Every private name of Ray that the observer uses, in one place (the observer's ``jobs/infra/ray_internals.py``).

The observer runs inside jobs that may have no copy of ``jobs/`` (a user's own working_dir), so it
cannot import the client's module; its own uses of Ray's private code stay here instead, each
imported so that a Ray that moved it leaves the observer inert, never the job broken. The two
modules share no symbol: this one holds Ray Train's callback interfaces and the GCS client, which
only the observer uses; ``tests/test_ray_internals.py`` lets no other module touch Ray's private code.
"""

from __future__ import annotations

from typing import Any

try:
    from ray.train.v2.api.callback import RayTrainCallback
except Exception:  # a Ray without Train v2: nothing builds callbacks from the variable anyway
    RayTrainCallback = object  # type: ignore[assignment,misc]

try:
    # Ray builds callbacks named in RAY_TRAIN_CALLBACKS as these interfaces; the public UserCallback is not called.
    from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerGroupCallback

    INTERFACES_MISSING: str | None = None
except Exception as _exc:  # noqa: BLE001 - a Ray that moved them
    ControllerCallback = ReportCallback = WorkerGroupCallback = None  # type: ignore[assignment,misc]
    INTERFACES_MISSING = f"Ray Train's callback interfaces could not be imported ({type(_exc).__name__}: {_exc})"


def callback_bases(*wanted: Any) -> tuple[type, ...]:
    """The bases of a Ray Train callback: the ``wanted`` interfaces, or Ray's plain callback when they are missing
    (a callback no hook calls, which Ray can still build)."""
    found = tuple(base for base in wanted if base is not None)
    return found if len(found) == len(wanted) and found else (RayTrainCallback,)


def gcs_client(address: str) -> Any:
    """A client of the cluster's GCS at ``address`` (its key-value store), without ``ray.init``."""
    from ray._raylet import GcsClient

    return GcsClient(address=address)


def free_resources(client: Any) -> dict[str, float]:
    """What the cluster's live nodes have free now, summed per resource (the autoscaler's own view)."""
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    free: dict[str, float] = {}
    for node in get_cluster_resource_state(client).node_states:
        if node.status == 2:  # DEAD in autoscaler.proto's NodeStatus
            continue
        for name, amount in node.available_resources.items():
            free[name] = free.get(name, 0.0) + amount
    return free
