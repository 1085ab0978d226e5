"""Private, loopback-only Ray clusters for local development (``rayjobs cluster up|down|status``).

The lifecycle is in :mod:`runner.local.lifecycle`, ports in :mod:`~runner.local.ports`, the token
and environment in :mod:`~runner.local.environment`, worker nodes in :mod:`~runner.local.workers`.
This façade names what the rest of rayjobs uses.
"""

from runner.local.environment import loopback_env
from runner.local.errors import ClusterError, InvalidClusterRequest
from runner.local.lifecycle import MAX_NODES, find_running, find_serving, list_running, start, status, stop
from runner.local.nodes import NodeInfo, list_nodes
from runner.local.processes import cluster_processes
from runner.local.state import DEFAULT_CLUSTER_NAME, LocalCluster, WorkerNode, cluster_dir, rayjobs_home

__all__ = [
    "DEFAULT_CLUSTER_NAME", "MAX_NODES", "ClusterError", "InvalidClusterRequest", "LocalCluster", "NodeInfo",
    "WorkerNode", "cluster_dir", "cluster_processes", "find_running", "find_serving", "list_nodes",
    "list_running", "loopback_env", "rayjobs_home", "start", "status", "stop",
]
