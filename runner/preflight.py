"""Refusing, before submission, an entrypoint that no node of the cluster can ever host.

Ray would accept such a job and leave it PENDING until its supervisor gives up
(15 minutes by default). A cluster with an autoscaler may still grow, so there the
check only warns.
"""

from __future__ import annotations

from typing import Any, Callable

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
    try:
        nodes = api.node_resources()
        if not nodes:
            return  # nothing reported (yet): let Ray decide
        best = unmet_on_every_node(demand, nodes)
        if best is None:
            return
        autoscaling = api.has_autoscaler()
    except RayJobsError:
        return  # the check is a courtesy; a dashboard that cannot answer it must not block submission
    wanted = ", ".join(f"{name} {_amount(name, value)}" for name, value in demand.items())
    offered = ", ".join(f"{name} {_amount(name, value)}" for name, value in best.items())
    message = (f"the entrypoint asks for {wanted}, but the largest of the cluster's {len(nodes)} node(s) "
               f"offers {offered}")
    if autoscaling:
        warn(f"{message}; submitting anyway because the cluster autoscales")
        return
    raise BadInput(f"{message}, so Ray would leave the job PENDING until it times out. Lower "
                   "entrypoint_num_cpus/_gpus/_memory/_resources in the spec, or use a bigger cluster")


def _amount(name: str, value: float) -> str:
    if name == "memory" or name.endswith("memory"):
        return f"{value / 2**30:.1f} GiB"
    return f"{value:g}"
