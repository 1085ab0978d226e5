"""The nodes of a running local cluster as its GCS sees them, read through the dashboard's state API."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from jobs.infra.http import Unanswered, fetch
from runner.local.errors import ClusterError
from runner.local.state import LocalCluster

HEAD_ROLE = "head"
# Dead nodes stay in the GCS's list for a while; a local cluster never has many.
_NODE_LIST_LIMIT = 1000
_REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeInfo:
    """One node of a cluster: ``role`` is ``head``, ``worker-N`` for a node rayjobs started, else Ray's node name."""

    role: str
    node_id: str
    cpus: float | None
    alive: bool
    state: str

    def to_dict(self) -> dict[str, Any]:
        """The node as plain JSON values."""
        return asdict(self)


def list_nodes(cluster: LocalCluster, timeout_s: float = _REQUEST_TIMEOUT_S) -> list[NodeInfo]:
    """Every node the cluster's GCS knows, alive or dead: the head first, then worker nodes by role.

    Args:
        cluster: a running local cluster.
        timeout_s: how long the dashboard may take to answer.

    Returns:
        The nodes.

    Raises:
        ClusterError: the dashboard did not answer, or answered with something that is not a node list.
    """
    path = f"/api/v0/nodes?limit={_NODE_LIST_LIMIT}"
    document = dashboard_json(cluster, path, timeout_s)
    try:
        rows = document["data"]["result"]["result"]
        nodes = [_node_info(row) for row in rows]
    except (KeyError, TypeError, ValueError):
        raise ClusterError(f"The dashboard of local cluster '{cluster.name}' answered {path} with no node list.") from None
    return sorted(nodes, key=_display_order)


def _node_info(row: dict[str, Any]) -> NodeInfo:
    cpus = (row.get("resources_total") or {}).get("CPU")
    state = str(row["state"])
    return NodeInfo(
        role=HEAD_ROLE if row.get("is_head_node") else str(row.get("node_name") or row["node_id"]),
        node_id=str(row["node_id"]),
        cpus=float(cpus) if cpus is not None else None,
        alive=state == "ALIVE",
        state=state,
    )


def _display_order(node: NodeInfo) -> tuple[int, int, str]:
    if node.role == HEAD_ROLE:
        return (0, 0, node.node_id)
    prefix, _, number = node.role.rpartition("-")
    if prefix == "worker" and number.isdigit():
        return (1, int(number), node.node_id)
    return (2, 0, node.role)


def dashboard_json(cluster: LocalCluster, path: str, timeout_s: float = _REQUEST_TIMEOUT_S) -> Any:
    """The JSON answer of the cluster's dashboard to a GET of ``path`` (with its token), or ClusterError."""
    url = f"{cluster.dashboard_url}{path}"
    try:
        answer = fetch(url, headers=cluster.auth_headers(), timeout_s=timeout_s)
    except Unanswered as exc:
        raise ClusterError(f"The dashboard did not answer {url}: {exc.reason}.") from None
    if answer.status >= 400:
        raise ClusterError(f"The dashboard answered {url} with HTTP {answer.status}.")
    try:
        return json.loads(answer.body)
    except ValueError:
        raise ClusterError(f"The dashboard answered {url} with something that is not JSON.") from None
