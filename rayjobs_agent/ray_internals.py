"""Every private name of Ray that the agent uses, in one place (the agent's ``jobs/infra/ray_internals.py``).

The agent runs inside jobs that may have no copy of ``jobs/`` (a user's own working_dir), so it
cannot import the client's module; its own uses of Ray's private code stay here instead, each
imported so that a Ray that moved it leaves the agent inert, never the job broken. The two
modules share no symbol: this one holds Ray Train's callback interfaces, the GCS client and the
autoscaler's view of the nodes (what each has, what waits), which only the agent uses;
``tests/test_ray_internals.py`` lets no other module touch Ray's private code.
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


def node_totals(client: Any) -> list[dict[str, float]]:
    """What each live node of the cluster has in all (its total resources), from the autoscaler's own view."""
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    return [dict(node.total_resources) for node in get_cluster_resource_state(client).node_states
            if node.status != 2]  # 2: DEAD in autoscaler.proto's NodeStatus


def pending_demand(client: Any) -> tuple[dict[str, float], str, dict[str, float]] | None:
    """The cluster's first pending demand, as ``(resources asked, for what, the live nodes' total)``; None when
    nothing waits. A placement group's bundles are summed (Ray Train's worker group is one)."""
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    state = get_cluster_resource_state(client)
    total: dict[str, float] = {}
    for node in state.node_states:
        if node.status == 2:  # DEAD in autoscaler.proto's NodeStatus
            continue
        for name, amount in node.total_resources.items():
            total[name] = total.get(name, 0.0) + amount
    for gang in state.pending_gang_resource_requests:
        asked: dict[str, float] = {}
        for request in gang.requests:
            for name, amount in request.resources_bundle.items():
                asked[name] = asked.get(name, 0.0) + amount
        if asked:
            return asked, "a placement group", total
    for by_count in state.pending_resource_requests:
        asked = dict(by_count.request.resources_bundle)
        if asked:
            return asked, "one task or actor", total
    return None


def ray_nvml() -> Any:
    """NVML's Python binding as Ray ships it (``pynvml``), where no other is installed."""
    from ray._private.thirdparty import pynvml

    return pynvml


def dashboard_address(client: Any) -> str:
    """``host:port`` of the cluster's dashboard, as the head wrote it into the GCS (what ``ray.init`` reads)."""
    from ray._private import ray_constants

    address = client.internal_kv_get(ray_constants.DASHBOARD_ADDRESS.encode(), ray_constants.KV_NAMESPACE_DASHBOARD)
    if not address:
        raise RuntimeError("the cluster's dashboard has not written its address")
    return address.decode()


def logs_dir() -> str:
    """The Ray log folder of this node's session (inside a Ray worker), which Ray's log API serves."""
    from ray._private.worker import global_worker

    return global_worker.node.get_logs_dir_path()
