"""Starting, stopping and finding the local clusters: the lifecycle behind ``rayjobs cluster up|down|status``.

:func:`start` runs ``ray start --head --block`` in a new session with every port chosen free on
127.0.0.1, so several clusters (other users', other test sessions') can run side by side on one
machine. With ``nodes=N`` it adds N-1 worker nodes (:mod:`runner.local.workers`). Only the
processes of those sessions are ever stopped: there is no machine-wide ``ray stop`` here.

A cluster started with ``gcs_store`` (``redis://HOST:PORT``) keeps its GCS in that Redis (Ray's GCS fault
tolerance), under a namespace of its own. When its head dies, its record stays: the next :func:`start` of that name
starts the head again on the same ports, temp dir, token and namespace, so that clients, the cluster's own
processes and its jobs' logs are found where they were, and Ray finds its job table, actors and key-value store
again (a job that ran on the dead head still reads RUNNING there; the queue's keeper ends it as lost).

Finding a cluster comes in two kinds. :func:`find_running`, :func:`find_serving` and
:func:`list_running` only read state files and look at processes, so any command may call them,
whatever cluster it talks to. :func:`status`, :func:`start` and :func:`stop` also clean up after a
cluster that died: they remove its state file and kill what is left of its processes; only the
``rayjobs cluster`` commands and ``submit --local`` use them.

Errors are :class:`ClusterError` (exit code 4) or, for a bad name or option,
:class:`InvalidClusterRequest` (exit code 2). Nothing here imports ``ray``, to keep CLI start-up fast.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from pathlib import Path
from typing import Callable

from runner.local.environment import redis_address
from runner.local.errors import ClusterError, InvalidClusterRequest
from runner.local.launch import TransientStartFailure, find_ray_executable, launch
from runner.local.processes import leader_is_alive, reap, stop_cluster_processes
from runner.local.state import (
    DEFAULT_CLUSTER_NAME,
    FAILED_START_LOGS,
    TOKEN_FILE,
    LocalCluster,
    check_name,
    cluster_dir,
    forget_state,
    name_lock,
    peek_all_states,
    peek_state,
    read_state,
    write_new_token,
    write_state,
)
from runner.local.workers import add_worker_nodes, object_store_bytes

# Free ports are only reserved until our probe sockets close, so another program may grab one
# before Ray binds it; and Ray gives a node a fixed 30 s to register, which a busy machine can
# miss. One retry on fresh ports covers both.
_START_ATTEMPTS = 2
# Time a dead cluster's leftover processes get to stop before they are killed.
_STALE_CLEANUP_TIMEOUT_S = 5
# Each node runs its own raylet, agents and object store (a few hundred MB of memory).
MAX_NODES = 32


def start(
    name: str = DEFAULT_CLUSTER_NAME,
    num_cpus: int | None = None,
    auth: bool = True,
    timeout_s: float = 90,
    ray_executable: str | None = None,
    progress: Callable[[str], None] | None = None,
    nodes: int = 1,
    gcs_store: str | None = None,
) -> LocalCluster:
    """Start a loopback-only Ray cluster and wait until its job API answers and all its nodes are alive.

    A stale record of a cluster of that name (its leader is gone) is cleaned up first, unless its head kept
    its GCS in Redis: that cluster is started again as it was (same ports, token, temp dir, store and
    namespace, as many nodes), whatever the other arguments say, when ``gcs_store`` is None or the same.

    Args:
        name: the cluster's name (letters, digits, '.', '_', '-').
        num_cpus: CPUs each node offers; None for all of the machine's.
        auth: whether the cluster requires a token (written to the cluster's directory).
        timeout_s: how long the head may take to come up, and then the worker nodes to join.
        ray_executable: the ``ray`` command to use; see :func:`runner.local.launch.find_ray_executable`.
        progress: receives short status lines while waiting.
        nodes: how many nodes, the head included (1 to :data:`MAX_NODES`). With more than one,
            each node's object store is sized to fit ``/dev/shm`` (see
            :func:`runner.local.workers.object_store_bytes`).
        gcs_store: ``redis://HOST:PORT``: the head keeps its GCS in that Redis (under a namespace of this
            cluster's), so that it survives a restart of the head; None keeps it in the head's memory.

    Returns:
        The running cluster, as recorded in its state file.

    Raises:
        InvalidClusterRequest: a bad name, ``num_cpus``, ``nodes``, ``timeout_s`` or ``gcs_store``.
        ClusterError: ``ray`` was not found, a cluster of that name is already running or being
            started, or Ray did not come up within ``timeout_s`` (everything started is then
            killed again; the message names the node that did not come up).
    """
    check_name(name)
    if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
        raise InvalidClusterRequest(f"num_cpus must be a positive whole number, got {num_cpus!r}.")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise InvalidClusterRequest(f"nodes must be a whole number from 1 to {MAX_NODES}, got {nodes!r}.")
    if timeout_s <= 0:
        raise InvalidClusterRequest(f"timeout_s must be positive, got {timeout_s!r}.")
    if gcs_store is not None:
        redis_address(gcs_store)
    ray_path = find_ray_executable(ray_executable)
    directory = cluster_dir(name)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    with name_lock(directory):
        existing = status(name)
        if existing is not None:
            raise ClusterError(
                f"Local cluster '{name}' is already running at {existing.dashboard_url} "
                f"(pid {existing.pid}); stop it first."
            )
        stale = peek_state(name)  # kept by status() only for a head whose GCS is in Redis
        if stale is not None and stale.gcs_store and gcs_store in (None, stale.gcs_store):
            return _start_again(stale, directory, ray_path, timeout_s, progress)
        if stale is not None:
            forget_state(stale)
        namespace = f"rayjobs-{name}-{secrets.token_hex(8)}" if gcs_store is not None else None
        token_file = write_new_token(directory / TOKEN_FILE) if auth else None
        if not auth:
            with contextlib.suppress(FileNotFoundError):
                (directory / TOKEN_FILE).unlink()
        object_store_memory = object_store_bytes(nodes)
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                cluster = launch(
                    name, directory, ray_path, num_cpus, token_file, timeout_s, progress, object_store_memory,
                    gcs_store, namespace,
                )
                if nodes > 1:
                    add_worker_nodes(cluster, nodes - 1, ray_path, num_cpus, token_file, timeout_s, progress)
            except TransientStartFailure as failure:
                if attempt == _START_ATTEMPTS:
                    raise ClusterError(
                        f"{failure} It was tried {_START_ATTEMPTS} times, each on fresh ports."
                    ) from None
                if progress:
                    progress(f"cluster '{name}' did not start ({_first_sentence(failure)}); trying again on fresh ports")
                continue
            write_state(cluster)
            shutil.rmtree(directory / FAILED_START_LOGS, ignore_errors=True)
            return cluster
    raise AssertionError("unreachable")


def _start_again(stale: LocalCluster, directory: Path, ray_path: str, timeout_s: float,
                 progress: Callable[[str], None] | None) -> LocalCluster:
    """Start again a cluster whose head kept its GCS in Redis and died: on its ports, with its token and namespace.

    What is left of it is killed first (its worker nodes too: they are started again with it). A port taken
    meanwhile by another program fails the start; the record stays, for another try.
    """
    stop_cluster_processes(stale, leader_alive=False, timeout_s=_STALE_CLEANUP_TIMEOUT_S)
    for worker in stale.worker_nodes:
        reap(worker.pid)
    reap(stale.pid)
    token_file = Path(stale.token_file) if stale.token_file else None
    if token_file is not None and not token_file.is_file():
        raise ClusterError(f"Local cluster '{stale.name}' cannot be started again: its token file {token_file} is "
                           f"gone. Stop it (rayjobs cluster down --name {stale.name}) and start it afresh.")
    if progress:
        progress(f"cluster '{stale.name}' keeps its GCS in {stale.gcs_store}: starting its head again on its ports")
    cluster = launch(stale.name, directory, ray_path, stale.num_cpus, token_file, timeout_s, progress,
                     stale.object_store_memory, stale.gcs_store, stale.storage_namespace, again=stale)
    if stale.worker_nodes:
        add_worker_nodes(cluster, len(stale.worker_nodes), ray_path, stale.num_cpus, token_file, timeout_s, progress)
    write_state(cluster)
    return cluster


def _first_sentence(failure: Exception) -> str:
    return str(failure).split(". ", 1)[0]


def stop(name: str = DEFAULT_CLUSTER_NAME, timeout_s: float = 30) -> bool:
    """Stop the named cluster and every process it started, and remove its state.

    Sends SIGTERM to the worker nodes' ``ray start`` leaders, then to the head's, each of which
    stops its node's daemons, and waits up to ``timeout_s`` for them. Then whatever of the cluster is left (found by session id or by its
    temp dir on the command line) gets SIGTERM and a few seconds' grace, then SIGKILL.

    Args:
        name: the cluster's name.
        timeout_s: how long the orderly shutdown may take.

    Returns:
        False if no cluster of that name was running (a stale record is still cleaned up).

    Raises:
        InvalidClusterRequest: a bad name.
        ClusterError: the state file cannot be read.
    """
    cluster = read_state(name)
    if cluster is None:
        return False
    leader_alive = leader_is_alive(cluster)
    killed_any = stop_cluster_processes(cluster, leader_alive=leader_alive, timeout_s=timeout_s)
    for worker in cluster.worker_nodes:
        reap(worker.pid)
    reap(cluster.pid)
    forget_state(cluster)
    return leader_alive or killed_any


def status(name: str = DEFAULT_CLUSTER_NAME) -> LocalCluster | None:
    """The named cluster if it is running; otherwise its stale record is cleaned up.

    A state file whose leader process is gone (or whose pid now belongs to some other program)
    is stale: it is removed, and leftover processes of that cluster are killed, so the name can
    be used again. The record of a cluster whose head kept its GCS in Redis is kept (its leftover
    processes are killed all the same): :func:`start` brings that cluster back, :func:`stop` forgets it.
    For a lookup that changes nothing, use :func:`find_running`.

    Args:
        name: the cluster's name.

    Returns:
        The running cluster, or None.

    Raises:
        InvalidClusterRequest: a bad name.
        ClusterError: the state file cannot be read.
    """
    cluster = read_state(name)
    if cluster is None:
        return None
    if leader_is_alive(cluster):
        return cluster
    stop_cluster_processes(cluster, leader_alive=False, timeout_s=_STALE_CLEANUP_TIMEOUT_S)
    if not cluster.gcs_store:
        forget_state(cluster)
    return None



def find_running(name: str) -> LocalCluster | None:
    """The named cluster if it is running; reads state only, never cleans up.

    Args:
        name: the cluster's name.

    Returns:
        The running cluster, or None (also for a missing, garbled or stale state file).

    Raises:
        InvalidClusterRequest: a bad name.
    """
    cluster = peek_state(name)
    return cluster if cluster is not None and leader_is_alive(cluster) else None


def find_serving(address: str) -> LocalCluster | None:
    """The running local cluster whose dashboard ``address`` reaches, however it is spelled; reads state only.

    Args:
        address: a dashboard address (``http://127.0.0.1:8265``, ``localhost:8265/``, ...).

    Returns:
        The running cluster, or None when no local cluster serves that address.

    Raises:
        ValueError: ``address`` is not an http(s) address with a host.
    """
    from jobs.infra.address import dashboard_endpoint

    wanted = dashboard_endpoint(address)
    for cluster in peek_all_states():
        try:
            serves_it = dashboard_endpoint(cluster.dashboard_url) == wanted
        except ValueError:  # a hand-edited state file; it describes no cluster rayjobs started
            continue
        if serves_it and leader_is_alive(cluster):
            return cluster
    return None


def list_running() -> list[LocalCluster]:
    """Every running local cluster under ``$RAYJOBS_HOME``, in name order; reads state only."""
    return [cluster for cluster in peek_all_states() if leader_is_alive(cluster)]
