"""A node of a local cluster lost on purpose: a cluster of several nodes started through the CLI, where the
training workers run, and the raylet of a worker node to kill while they do.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.local import LocalCluster, cluster_processes
from runner.local.nodes import dashboard_json
from runner.local.state import WorkerNode
from tests.support.cli import cli_env, run_rayjobs

# The GCS declares a silent node dead after health checks fail (by default about 15 s); checked every second
# and given up after three misses, a test that kills a node waits seconds instead. Nothing else changes.
QUICK_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                       "RAY_health_check_failure_threshold": "3"}


@contextlib.contextmanager
def started_cluster(home: Path, name: str, nodes: int) -> Iterator[Path]:
    """A cluster of ``nodes`` one-CPU nodes named ``name`` under RAYJOBS_HOME ``home``, stopped afterwards."""
    up = run_rayjobs("cluster", "up", "--name", name, "--nodes", str(nodes), "--num-cpus", "1",
                     home=home, timeout=400, env=cli_env(home, **QUICK_HEALTH_CHECKS))
    try:
        assert up.returncode == 0, up.stderr
        assert f"with {nodes} nodes" in up.stderr
        yield home
    finally:
        run_rayjobs("cluster", "down", "--name", name, home=home, timeout=120)


def cluster_of(home: Path, name: str) -> LocalCluster:
    """The cluster ``name`` as its ``cluster.json`` under RAYJOBS_HOME ``home`` describes it."""
    return LocalCluster.from_json((home / "clusters" / name / "cluster.json").read_text())


def cluster_status(home: Path, name: str) -> dict[str, Any]:
    """``rayjobs cluster status --output json`` of cluster ``name``."""
    result = run_rayjobs("cluster", "status", "--name", name, "--output", "json", home=home, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def alive_nodes(home: Path, name: str) -> int:
    """How many nodes of cluster ``name`` are alive."""
    return sum(node["alive"] for node in cluster_status(home, name)["nodes"])


def training_worker_nodes(cluster: LocalCluster) -> set[str]:
    """Node ids of the live Ray Train worker actors, from the dashboard's state API."""
    document = dashboard_json(cluster, "/api/v0/actors?limit=1000", timeout_s=10)
    return {row["node_id"] for row in document["data"]["result"]["result"]
            if "RayTrainWorker" in row.get("class_name", "") and row.get("state") == "ALIVE"}


def raylet_of(cluster: LocalCluster, node: WorkerNode):
    """The raylet of a worker node rayjobs started: the one in that node's process session."""
    raylets = [proc for proc in cluster_processes(cluster)
               if proc.name() == "raylet" and os.getsid(proc.pid) == node.pid]
    assert len(raylets) == 1, raylets
    return raylets[0]


def lose_a_training_workers_node(home: Path, name: str) -> WorkerNode:
    """SIGKILL the raylet of a worker node (never the head) that runs a training worker now; return the node."""
    cluster = cluster_of(home, name)
    roles = {node["node_id"]: node["role"] for node in cluster_status(home, name)["nodes"]}
    victims = sorted(roles[node_id] for node_id in training_worker_nodes(cluster) if roles[node_id] != "head")
    assert victims, "every training worker ran on the head node"
    victim = next(node for node in cluster.worker_nodes if node.name == victims[0])
    raylet_of(cluster, victim).send_signal(signal.SIGKILL)
    return victim


def submitted_job_id(stderr: str) -> str:
    """The submission id ``rayjobs submit`` printed."""
    found = re.search(r"as (raysubmit_\w+)", stderr)
    assert found, stderr
    return found[1]


def job_ended(home: Path, name: str, job_id: str) -> dict[str, Any] | None:
    """``rayjobs status --output json`` of the job once it has ended; None while it runs."""
    status = run_rayjobs("status", job_id, "--cluster", name, "--output", "json", home=home, timeout=60)
    document = json.loads(status.stdout) if status.returncode in (0, 1) and status.stdout else {}
    return document if document.get("status") in ("SUCCEEDED", "FAILED", "STOPPED") else None
