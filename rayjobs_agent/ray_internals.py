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

from .wire import SUBMISSION_ID_KEY

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


# Ray's job manager names each job's supervisor actor so (ray.dashboard.modules.job.common), in this namespace.
SUPERVISOR_NAME_PREFIX = "_ray_internal_job_actor_"
SUPERVISOR_NAMESPACE = "SUPERVISOR_ACTOR_RAY_NAMESPACE"


def placed_resources(client: Any, submission_ids: list[str]) -> dict[str, dict[str, float]]:
    """What Ray has placed for each of ``submission_ids`` (inside a process connected to the cluster): its
    entrypoint's resources while its supervisor actor is alive, the bundles of the placement groups its driver
    created once they are, and its other live actors. Tasks are not counted: a job that runs only tasks shows less
    than it uses, and so has what it declared held for it longer, never shorter.

    A placement group counts once the cluster's resource view (what :func:`free_resources` reads) shows its
    bundles: the group table says CREATED a moment before the nodes' reports take its CPUs off what is free, and a
    group counted in between would be counted neither as free nor as promised.
    """
    from ray._private.state import state
    from ray.autoscaler.v2.sdk import get_cluster_resource_state
    from ray.core.generated import gcs_pb2

    wanted = set(submission_ids)
    placed: dict[str, dict[str, float]] = {job_id: {} for job_id in wanted}

    def add(job_id: str, resources: Any) -> None:
        into = placed[job_id]
        for name, amount in resources.items():
            if "_group_" not in name:  # a placement group's own names: its bundles are counted once, below
                into[name] = into.get(name, 0.0) + float(amount)

    drivers: dict[str, str] = {}
    for job_id, data in client.get_all_job_info().items():
        submission = data.config.metadata.get(SUBMISSION_ID_KEY)
        if submission in wanted and not data.is_dead:
            drivers[job_id.hex()] = submission
    accessor = state._connect_and_get_accessor()
    nil_group = b"\xff" * 18
    for raw in accessor.get_actor_table(None, "ALIVE"):
        actor = gcs_pb2.ActorTableData.FromString(raw)
        name = actor.name
        if name.startswith(SUPERVISOR_NAME_PREFIX) and name[len(SUPERVISOR_NAME_PREFIX):] in wanted:
            add(name[len(SUPERVISOR_NAME_PREFIX):], actor.required_resources)
        elif actor.job_id.hex() in drivers and actor.placement_group_id in (b"", nil_group):
            add(drivers[actor.job_id.hex()], actor.required_resources)
    created = gcs_pb2.PlacementGroupTableData.PlacementGroupState.Value("CREATED")
    groups = [gcs_pb2.PlacementGroupTableData.FromString(raw) for raw in accessor.get_placement_group_table()]
    groups = [group for group in groups if group.state == created and group.creator_job_id.hex() in drivers]
    if groups:
        shown = {name for node in get_cluster_resource_state(client).node_states for name in node.total_resources}
        for group in groups:
            if f"bundle_group_{group.placement_group_id.hex()}" in shown:
                for bundle in group.bundles:
                    add(drivers[group.creator_job_id.hex()], bundle.unit_resources)
    return placed


def settle_job(client: Any, job_id: str, status: str, message: str, *, lost: bool = False) -> None:
    """End job ``job_id`` in Ray's job table as ``status`` with ``message`` (inside a process connected to the
    cluster), then take down its supervisor actor if it has one: an order job whose supervisor was never placed,
    or a job whose processes died with their node while Ray's table still says it runs.

    ``lost``: the job's supervisor died (Ray's own error type for that), for the retry rule to read.
    """
    import asyncio

    from ray.dashboard.modules.job.common import JobErrorType, JobInfoStorageClient, JobStatus

    error_type = JobErrorType.JOB_SUPERVISOR_ACTOR_DIED if lost else None
    try:
        asyncio.run(JobInfoStorageClient(client).put_status(job_id, JobStatus(status), message=message,
                                                            error_type=error_type))
    except RuntimeError as exc:
        if "terminal state" not in str(exc):
            raise  # a job that ended meanwhile keeps how it ended
    kill_supervisor(job_id)


def has_supervisor(job_id: str) -> bool | None:
    """Whether the supervisor actor of submission ``job_id`` exists, pending or alive (inside a process connected to
    the cluster); None when the cluster could not say."""
    import ray

    try:
        ray.get_actor(SUPERVISOR_NAME_PREFIX + job_id, namespace=SUPERVISOR_NAMESPACE)
    except ValueError:
        return False
    except Exception:  # noqa: BLE001 - the GCS may be restarting: nothing is decided on it
        return None
    return True


def supervised_jobs(prefix: str) -> list[str]:
    """The submission ids beginning with ``prefix`` whose supervisor actor exists, pending or alive (inside a process
    connected to the cluster)."""
    import ray

    start = SUPERVISOR_NAME_PREFIX + prefix
    return [entry["name"][len(SUPERVISOR_NAME_PREFIX):] for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry.get("namespace") == SUPERVISOR_NAMESPACE and str(entry.get("name", "")).startswith(start)]


def kill_supervisor(job_id: str) -> None:
    """Take down the supervisor actor of submission ``job_id``, if it has one (inside a process connected to the
    cluster)."""
    import ray

    try:
        supervisor = ray.get_actor(SUPERVISOR_NAME_PREFIX + job_id, namespace=SUPERVISOR_NAMESPACE)
    except ValueError:
        return
    ray.kill(supervisor, no_restart=True)


def alive_nodes(client: Any) -> set[str]:
    """The ids (hex) of the cluster's live nodes, from the autoscaler's own view."""
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    return {node.node_id.hex() if isinstance(node.node_id, bytes) else str(node.node_id)
            for node in get_cluster_resource_state(client).node_states if node.status != 2}  # 2: DEAD


def logs_dir() -> str:
    """The Ray log folder of this node's session (inside a Ray worker), which Ray's log API serves."""
    from ray._private.worker import global_worker

    return global_worker.node.get_logs_dir_path()
