"""Worker nodes of a local cluster: more ``ray start --address=<head>`` processes on 127.0.0.1.

Each worker node is its own ``ray start --block`` with its own raylet, object store and ports, in a
process session of its own, with the head's environment (so token auth holds on every node). Its
temp dir is a folder inside the head's (so Ray's daemons of every node name the cluster's temp dir
on their command lines), never the head's itself: nodes that share one session folder race for the
same unix socket names when they start together.

Every node of a local cluster runs with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: that keeps Ray's
address resolution on the loopback address (with it on, Ray swaps ``127.0.0.1`` in ``--address``
and ``--node-ip-address`` for the machine's outward address, where the head does not listen). The
same setting makes ``ray start`` refuse to join a cluster, so worker nodes run ``ray start``
through :data:`jobs.infra.ray_internals.WORKER_NODE_LAUNCHER`, which lifts only that refusal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from runner.backoff import Backoff, Deadline
from runner.local.environment import ray_start_env
from runner.local.errors import ClusterError
from runner.local.launch import (TransientStartFailure, keep_session_logs, log_shows_transient_failure,
                                 log_tail_sentence, node_options)
from jobs.infra.ray_internals import WORKER_NODE_LAUNCHER
from runner.local.nodes import list_nodes
from runner.local.ports import LOOPBACK_HOST, NODE_PORT_OPTIONS, free_ports
from runner.local.processes import leader_is_alive, process_create_time, reap, stop_cluster_processes, track_child
from runner.local.state import FAILED_START_LOGS, LocalCluster, WorkerNode

_MIB = 1024 * 1024
# Per node, when a cluster has several: small enough that several fit in /dev/shm beside other
# people's clusters, large enough for Ray's 75 MiB floor and a few batches of images.
_OBJECT_STORE_MAX_BYTES = 512 * _MIB
_OBJECT_STORE_MIN_BYTES = 128 * _MIB
_SHM_PATH = "/dev/shm"
_NODE_POLL_FIRST_S = 0.2
_NODE_POLL_MAX_S = 1.0
_CLEANUP_TIMEOUT_S = 10
# The GCS address the head writes into its temp dir (Ray's own record, read by `ray.init("auto")`).
_HEAD_ADDRESS_FILE = "ray_current_cluster"


def worker_node_name(index: int) -> str:
    """The Ray node name of the ``index``-th worker node (1-based); ``cluster status`` shows it as the role."""
    return f"worker-{index}"


def object_store_bytes(node_count: int) -> int | None:
    """Object store size per node for a cluster of ``node_count`` nodes; None (Ray's default) for one node.

    Ray's default is 30% of the machine's memory per node, which several nodes on one machine
    cannot all have in ``/dev/shm``; then each gets an equal share of half of what is free there,
    between 128 MiB and 512 MiB.
    """
    if node_count <= 1:
        return None
    try:
        stats = os.statvfs(_SHM_PATH)
        shm_free = stats.f_bavail * stats.f_frsize
    except OSError:
        shm_free = 0
    share = shm_free // (2 * node_count) // _MIB * _MIB
    return max(_OBJECT_STORE_MIN_BYTES, min(_OBJECT_STORE_MAX_BYTES, share))


def worker_temp_dir(cluster: LocalCluster, node_name: str) -> str:
    """The temp dir of one worker node: a folder of its own inside the cluster's temp dir."""
    return os.path.join(cluster.temp_dir, node_name)


def head_gcs_address(cluster: LocalCluster) -> str:
    """The GCS address the head reports in its temp dir; the recorded one if it has not written it."""
    try:
        reported = (Path(cluster.temp_dir) / _HEAD_ADDRESS_FILE).read_text().strip()
    except OSError:
        reported = ""
    return reported or cluster.gcs_address


def worker_start_command(
    python: str,
    head_address: str,
    temp_dir: str,
    node_name: str,
    ports: dict[str, int],
    num_cpus: int | None,
    object_store_memory: int | None,
) -> list[str]:
    """The command line of one worker node joining ``head_address``, bound to the loopback address on ``ports``."""
    command = [
        python,
        "-c",
        WORKER_NODE_LAUNCHER,
        "start",
        "--block",
        f"--address={head_address}",
        f"--node-ip-address={LOOPBACK_HOST}",
        f"--node-name={node_name}",
        "--disable-usage-stats",
    ]
    return command + node_options(temp_dir, ports, NODE_PORT_OPTIONS, num_cpus, object_store_memory)


def ray_python(ray_path: str) -> str:
    """The interpreter that runs the ``ray`` command (from its ``#!`` line), so worker nodes run the head's Ray."""
    try:
        with open(ray_path, "rb") as script:
            first_line = script.readline(1024).decode(errors="replace").strip()
    except OSError:
        first_line = ""
    words = first_line[2:].split() if first_line.startswith("#!") else []
    # A `#!/usr/bin/env python3` line names no path; the sibling search below covers it.
    if words and os.path.basename(words[0]).startswith("python") and os.access(words[0], os.X_OK):
        return words[0]
    for name in ("python3", "python"):
        sibling = Path(ray_path).parent / name
        if sibling.is_file() and os.access(sibling, os.X_OK):
            return str(sibling)
    raise ClusterError(f"Cannot find the Python interpreter of {ray_path} to start worker nodes with.")


def add_worker_nodes(
    cluster: LocalCluster,
    count: int,
    ray_path: str,
    num_cpus: int | None,
    token_file: Path | None,
    timeout_s: float,
    progress: Callable[[str], None] | None = None,
) -> LocalCluster:
    """Start ``count`` worker nodes that join the running head, and wait until all of them are alive.

    On any failure (Ctrl-C included) the whole cluster, head included, is stopped, its temp dir
    removed, and Ray's logs of the attempt kept in the cluster's ``failed-start-logs``.

    Args:
        cluster: the running head's record (not yet in its state file); its ``worker_nodes`` are set.
        count: how many worker nodes to add.
        ray_path: the ``ray`` executable the head runs.
        num_cpus: CPUs each worker node offers, or None for all of the machine's.
        token_file: the cluster's token file, or None without auth.
        timeout_s: how long the worker nodes may take to join.
        progress: receives short status lines while waiting.

    Returns:
        ``cluster``, now with its worker nodes.

    Raises:
        TransientStartFailure: a worker node could not bind a port picked for it, or did not
            register in time.
        ClusterError: a worker node exited, or did not join within ``timeout_s``.
    """
    directory = Path(cluster.log_file).parent
    env = ray_start_env(ray_path, int(cluster.ports["gcs"]), token_file)
    deadline = Deadline(timeout_s)
    processes: dict[str, subprocess.Popen] = {}
    try:
        python = ray_python(ray_path)
        head_address = head_gcs_address(cluster)
        all_ports = free_ports(
            [f"{index}:{key}" for index in range(1, count + 1) for key in NODE_PORT_OPTIONS.values()],
            avoid=set(cluster.ports.values()),
        )
        for index in range(1, count + 1):
            name = worker_node_name(index)
            ports = {key: all_ports[f"{index}:{key}"] for key in NODE_PORT_OPTIONS.values()}
            log_path = directory / f"ray-start-{name}.log"
            command = worker_start_command(
                python, head_address, worker_temp_dir(cluster, name), name, ports, num_cpus,
                cluster.object_store_memory,
            )
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=env, cwd=directory, start_new_session=True,
                )
            track_child(process)
            processes[name] = process
            cluster.worker_nodes.append(
                WorkerNode(name=name, pid=process.pid, log_file=str(log_path), ports=ports,
                           leader_create_time=process_create_time(process.pid))
            )
        wait_for_worker_nodes(cluster, processes, deadline, progress)
    except BaseException as failure:
        # Also on KeyboardInterrupt: nodes nobody knows about would hold ports and memory.
        _stop_failed_start(cluster, directory)
        if not isinstance(failure, ClusterError):
            raise
        message = str(failure)
        kept_logs = directory / FAILED_START_LOGS
        if kept_logs.is_dir():
            message += f" Ray's own logs of this attempt are in {kept_logs}."
        logs = [Path(worker.log_file) for worker in cluster.worker_nodes] + [kept_logs]
        logs += [kept_logs / worker.name for worker in cluster.worker_nodes]
        if any(log_shows_transient_failure(path if path.exists() else None) for path in logs):
            raise TransientStartFailure(message) from None
        raise ClusterError(message) from None
    return cluster


def wait_for_worker_nodes(
    cluster: LocalCluster,
    processes: dict[str, subprocess.Popen],
    deadline: Deadline,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Poll the cluster's node list until the head and every worker node in ``processes`` are alive.

    Raises:
        ClusterError: a worker node's ``ray start`` exited, or ``deadline`` passed; the message
            names the node and quotes its log.
    """
    if progress:
        progress(f"waiting for {len(processes)} worker node(s) of cluster '{cluster.name}' to join")
    backoff = Backoff(first_s=_NODE_POLL_FIRST_S, max_s=_NODE_POLL_MAX_S)
    logs = {worker.name: worker.log_file for worker in cluster.worker_nodes}
    last_error = ""
    while True:
        for name, process in processes.items():
            exit_code = process.poll()
            if exit_code is not None:
                raise ClusterError(
                    f"Worker node '{name}' of local cluster '{cluster.name}' exited with code {exit_code} "
                    f"before it joined. " + log_tail_sentence(logs[name])
                )
        try:
            alive = {node.role for node in list_nodes(cluster) if node.alive}
            last_error = ""
        except ClusterError as exc:
            alive, last_error = set(), str(exc)
        missing = [name for name in processes if name not in alive]
        if "head" not in alive:
            missing.insert(0, "head")
        if not missing:
            return
        if deadline.left() <= 0:
            first_worker = next((name for name in missing if name in logs), None)
            tail = " " + log_tail_sentence(logs[first_worker]) if first_worker else ""
            detail = f" ({last_error})" if last_error else ""
            raise ClusterError(
                f"Local cluster '{cluster.name}': node(s) {', '.join(missing)} did not come up within "
                f"{deadline.seconds:.0f} s{detail}.{tail}"
            )
        time.sleep(min(backoff.next_delay(), max(deadline.left(), 0.0)))


def _stop_failed_start(cluster: LocalCluster, directory: Path) -> None:
    """Stop every node of a cluster whose start failed, keeping Ray's logs of the attempt."""
    stop_cluster_processes(cluster, leader_alive=leader_is_alive(cluster), timeout_s=_CLEANUP_TIMEOUT_S)
    for worker in cluster.worker_nodes:
        reap(worker.pid)
    reap(cluster.pid)
    kept = keep_session_logs(cluster.temp_dir, directory / FAILED_START_LOGS)
    if kept is not None:
        for worker in cluster.worker_nodes:
            keep_session_logs(worker_temp_dir(cluster, worker.name), kept / worker.name)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
