"""The checks made before a job is sent: an entrypoint no node can host, and local paths a multi-node job shares.

Ray would accept a job whose entrypoint fits no node and leave it PENDING until its supervisor
gives up (15 minutes by default). A cluster with an autoscaler may still grow, so there the
check only warns. What a workload shares between nodes comes from its own declaration
(:mod:`jobs.workload_contract`), never from its field names.
"""

from __future__ import annotations

from typing import Any, Callable

from rayjobs_agent.storage_location import uri_scheme
from jobs.sweep import SweepDoesNotFit, sweep_concurrency
from jobs.worker_layout import AUTO_LEAST_CPUS, workers_that_fit
from jobs.workload_contract import workload_needs
from runner.errors import BadInput, RayJobsError


def entrypoint_demand(submission: dict[str, Any]) -> dict[str, float]:
    """What the entrypoint reserves, in Ray's resource names (only amounts above zero)."""
    demand = {
        "CPU": submission.get("entrypoint_num_cpus") or 0,
        "GPU": submission.get("entrypoint_num_gpus") or 0,
        "memory": submission.get("entrypoint_memory") or 0,
        **(submission.get("entrypoint_resources") or {}),
    }
    return {name: float(amount) for name, amount in demand.items() if amount and amount > 0}


def unmet_on_every_node(demand: dict[str, float], nodes: list[dict[str, float]]) -> dict[str, float] | None:
    """Whether some node can host ``demand``.

    Returns:
        None if some node has enough of every resource; else the most any single node offers of each.
    """
    if not demand or any(all(node.get(name, 0) >= amount for name, amount in demand.items()) for node in nodes):
        return None
    return {name: max((node.get(name, 0) for node in nodes), default=0) for name in demand}


def check_entrypoint_fits(api: Any, submission: dict[str, Any], warn: Callable[[str], None]) -> None:
    """Refuse an entrypoint that no node can host; only warn if the cluster autoscales.

    Args:
        api: the cluster client (``node_resources``, ``has_autoscaler``).
        submission: ``submit_job`` arguments with the entrypoint's resources.
        warn: hears why a submission goes ahead although no node fits it now.

    Raises:
        BadInput: no node offers enough of every resource asked for, and the cluster cannot grow.
        A cluster that cannot answer the check is not a reason to refuse: its errors are ignored.
    """
    demand = entrypoint_demand(submission)
    if not demand:
        return
    nodes = _nodes_or_none(api)
    best = unmet_on_every_node(demand, nodes) if nodes else None
    if best is None:
        return
    wanted = ", ".join(f"{name} {_amount(name, value)}" for name, value in demand.items())
    offered = ", ".join(f"{name} {_amount(name, value)}" for name, value in best.items())
    _refuse_unless_autoscaling(
        api, f"the entrypoint asks for {wanted}, but the largest of the cluster's {len(nodes)} node(s) offers {offered}",
        "so Ray would leave the job PENDING until it times out. Lower entrypoint_num_cpus/_gpus/_memory/_resources "
        "in the spec, or use a bigger cluster", warn)


def _nodes_or_none(api: Any) -> list[dict[str, float]] | None:
    """Each alive node's resources, or None when the cluster cannot say: the checks are a courtesy, and a
    dashboard that cannot answer them must not block submission."""
    try:
        return api.node_resources()
    except RayJobsError:
        return None


def _refuse_unless_autoscaling(api: Any, problem: str, advice: str, warn: Callable[[str], None]) -> None:
    """Raise BadInput (``problem``, then ``advice``); where the cluster autoscales, only warn; where it cannot say, pass."""
    try:
        autoscaling = api.has_autoscaler()
    except RayJobsError:
        return
    if autoscaling:
        warn(f"{problem}; submitting anyway because the cluster autoscales")
        return
    raise BadInput(f"{problem}, {advice}")


def check_sweep_fits(api: Any, loaded: Any, warn: Callable[[str], None]) -> None:
    """Refuse a sweep the cluster cannot run as asked: no trial fits, or fewer at once than ``max_concurrent``.

    One trial needs the workload's training workers (its Tune trial and Train controller reserve no CPU).
    The cluster's resources are summed over its alive nodes, as the job counts them, and the workers of one
    trial must also be placeable whole on the nodes (:func:`jobs.worker_layout.workers_that_fit`). An ``auto``
    CPU count counts as the least it gives. A cluster that autoscales gets a warning instead, and one that
    cannot answer is not a reason to refuse.

    A local cluster's sweep is also checked against the sweep already in its run folder
    (:func:`check_sweep_unchanged`).

    Raises:
        BadInput: the sweep does not fit, with the figures, and the cluster cannot grow; or it was edited.
    """
    check_sweep_unchanged(api, loaded)
    sweep = loaded.spec.sweep
    training = next((demand for demand in workload_needs(loaded.workload).demands if demand.phase == "training"),
                    None)
    nodes = _nodes_or_none(api) if sweep is not None and training is not None else None
    if not nodes:
        return
    resources = cluster_totals(nodes)
    advice = ("so lower sweep.max_concurrent (or set it to auto), ask less of each trial (workload.train.num_workers, "
              "cpus_per_worker, use_gpu), or use a bigger cluster")
    largest = max(node.get("CPU", 0) for node in nodes)
    # An auto CPU count is resolved when training starts: here it counts as the least it gives, so that what is
    # refused could not run whatever the cluster has free then.
    least = f"; cpus_per_worker auto gives each worker at least {AUTO_LEAST_CPUS} CPU" if training.auto_cpus else ""
    try:
        sweep_concurrency(sweep, training, resources)
    except SweepDoesNotFit as refused:
        _refuse_unless_autoscaling(api, f"{refused} (its largest node has {largest:g}{least})", advice, warn)
        return
    worker = {name: float(amount) for name, amount in
              {"CPU": training.cpus, "GPU": training.gpus, **training.resources}.items() if amount}
    placed = workers_that_fit(worker, nodes)
    if placed >= training.count:
        return
    wanted = ", ".join(f"{name} {_amount(name, value)}" for name, value in worker.items())
    if placed == 0:
        best = unmet_on_every_node(worker, nodes) or {}
        offered = ", ".join(f"{name} {_amount(name, value)}" for name, value in best.items())
        problem = (f"one worker of a trial asks for {wanted}, but the largest of the cluster's {len(nodes)} node(s) "
                   f"offers {offered}{least}: no trial can start")
    else:
        shown = "; ".join(", ".join(f"{name} {_amount(name, node.get(name, 0))}" for name in worker)
                          for node in nodes[:_NODES_SHOWN]) + ("; …" if len(nodes) > _NODES_SHOWN else "")
        problem = (f"a trial's {training.count} workers ask for {wanted} each{least}, and a worker runs whole on one "
                   f"node: the cluster's {len(nodes)} node(s) ({shown}) hold {placed} such workers at once, although "
                   "they have enough in all: no trial can start")
    _refuse_unless_autoscaling(api, problem, advice, warn)


# A refusal names each node's resources up to this many.
_NODES_SHOWN = 8


def check_sweep_unchanged(api: Any, loaded: Any) -> None:
    """Refuse, naming each changed field, a sweep sent to a local cluster whose run folder (on this machine's disk)
    holds a continuable sweep of another definition: the job would continue that one and ignore the edit.

    Elsewhere the run folder is not this machine's to read, and the job itself refuses the same way.
    """
    import json
    from pathlib import Path

    from jobs.sweep import SWEEP_DEFINITION, TUNE_DIR, definition_changes

    sweep = loaded.spec.sweep
    location = workload_needs(loaded.workload).run_location if sweep is not None else None
    connection = getattr(api, "connection", None)
    if (location is None or not is_local_location(location) or sweep.on_change != "refuse"
            or getattr(connection, "local_cluster", None) is None):
        return
    run_dir = Path(location.removeprefix("file://")).expanduser()
    stored = run_dir / SWEEP_DEFINITION
    if not stored.is_file() or not any((run_dir / TUNE_DIR).glob("experiment_state*.json")):
        return
    try:
        changes = definition_changes(json.loads(stored.read_text(encoding="utf-8")), sweep)
    except (OSError, ValueError):
        return  # a courtesy check: the job refuses a changed sweep too
    if changes:
        raise BadInput(f"the sweep in {run_dir} was started with another definition, and a sweep submitted again "
                       f"continues the one there, so these changes would be ignored: {'; '.join(changes)}. Set "
                       "sweep.on_change: restart to delete its trials and start this sweep from its first trial, "
                       "use a new run_name, or submit the sweep as it was")


def cluster_totals(nodes: list[dict[str, float]]) -> dict[str, float]:
    """Each resource summed over the cluster's alive nodes, as a job that spreads its workers counts them."""
    totals: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            totals[name] = totals.get(name, 0) + amount
    return totals


def _amount(name: str, value: float) -> str:
    if name == "memory" or name.endswith("memory"):
        return f"{value / 2**30:.1f} GiB"
    return f"{value:g}"


def is_local_location(value: str) -> bool:
    """Whether a storage location is a path on one machine's disk (``file://`` included) rather than object storage."""
    return uri_scheme(value) in (None, "file")


def local_shared_locations(workload: Any) -> dict[str, str]:
    """The locations a workload declares every node shares (parameter -> value) that are local paths."""
    shared = workload_needs(workload).shared_locations
    return {name: value for name, value in shared.items() if value and is_local_location(value)}


def shared_storage_note(local_cluster: str | None, workload: Any) -> str | None:
    """One line for stderr when a multi-node local cluster gets a job whose shared storage is a local path.

    On this machine all nodes share the disk, so the job works; on a real cluster each node has
    its own disk. Reads the cluster's state only.

    Args:
        local_cluster: the name of the local cluster the job goes to, or None for any other cluster.
        workload: the spec's validated workload parameters (``LoadedSpec.workload``), or None.

    Returns:
        The note, or None when there is nothing to say.
    """
    from runner.local import find_running

    if local_cluster is None:
        return None
    paths = local_shared_locations(workload)
    if not paths:
        return None
    cluster = find_running(local_cluster)
    if cluster is None or cluster.node_count <= 1:
        return None
    named = " and ".join(f"workload.{key} ({value})" for key, value in paths.items())
    one = len(paths) == 1
    return (
        f"local cluster '{cluster.name}' has {cluster.node_count} nodes and {named} "
        f"{'is a local path' if one else 'are local paths'}: fine here, where all nodes share this machine's "
        f"disk, but on a real multi-node cluster {'it' if one else 'they'} must be a shared mount or object "
        "storage (s3://, gs://)"
    )


def entrypoint_note(loaded: Any) -> str | None:
    """A warning when the spec's entrypoint does not run its workload's module: its parameters would be ignored.

    A wrapper script may still run it, so this is a warning, never a refusal.
    """
    module = workload_needs(loaded.workload).entrypoint_module
    if module is None or module in loaded.spec.entrypoint or module.replace(".", "/") in loaded.spec.entrypoint:
        return None
    return (f"workload '{loaded.workload_kind}' runs as `python -m {module}`, but the entrypoint is "
            f"`{loaded.spec.entrypoint}`: unless that runs it, the workload section is ignored")


def _check_quota(api: Any, needs: dict[str, float], queue: str) -> None:
    """Refuse a job that needs more than its queue's whole quota: no share of the cluster it may ever hold fits it."""
    from runner.client.queue import ClusterQueue

    try:
        (shown,) = ClusterQueue(api).describe(queue) or [{}]
    except RayJobsError:
        return  # a cluster that cannot answer is not a reason to refuse
    most = shown.get("quota") or {}
    over = {name: amount for name, amount in needs.items() if name in most and amount > float(most[name]) + 1e-9}
    if over:
        raise BadInput(f"the job needs {', '.join(f'{name} {_amount(name, amount)}' for name, amount in over.items())}"
                       f", more than queue {queue}'s whole quota ({', '.join(f'{name} {_amount(name, most[name])}' for name in over)}), "
                       f"so it would wait forever. Lower the spec's needs (or the workload's workers), or raise the "
                       f"quota: rayjobs queue set {queue} {' '.join(_quota_flag(name) for name in over)}")


def _quota_flag(name: str) -> str:
    """The `rayjobs queue set` option that sets the quota of resource ``name``."""
    return {"CPU": "--max-cpus N", "GPU": "--max-gpus N"}.get(name, f"--max {name}=N")


def check_queue_fits(api: Any, needs: dict[str, float], queue: str, warn: Callable[[str], None]) -> None:
    """Refuse a queued job whose ``needs`` the whole cluster does not have: it would wait in its queue forever.

    Raises:
        BadInput: the cluster's alive nodes together have less of some resource than the job needs, and the
            cluster cannot grow. A cluster that cannot answer is not a reason to refuse.
    """
    _check_quota(api, needs, queue)
    nodes = _nodes_or_none(api) if needs else None
    if not nodes:
        return
    totals = cluster_totals(nodes)
    short = {name: amount for name, amount in needs.items() if totals.get(name, 0) < amount}
    if not short:
        return
    wanted = ", ".join(f"{name} {_amount(name, amount)}" for name, amount in short.items())
    offered = ", ".join(f"{name} {_amount(name, totals.get(name, 0))}" for name in short)
    _refuse_unless_autoscaling(
        api, f"the job needs {wanted} to run, but the cluster's {len(nodes)} node(s) have {offered} in all",
        f"so it would wait in queue {queue} forever. Lower the spec's needs (or the workload's workers), "
        "or use a bigger cluster", warn)
