"""Finding and stopping the processes of one local cluster, and only those.

A cluster's processes are its ``ray start`` leaders (the head's and one per worker node), everything
in those leaders' process sessions, and anything whose command line names the cluster's private
temp dir (Ray's daemons do; they may have left the session). Nothing here runs a machine-wide
``ray stop``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from typing import Any

from runner.backoff import Deadline
from runner.local.state import LocalCluster, WorkerNode

_STRAGGLER_GRACE_S = 3.0
_KILL_ROUNDS = 3
# Cluster members were all born after the cluster started; this much clock slack is allowed.
_CREATE_TIME_SLACK_S = 2.0

# Popen objects of clusters started by this process, kept so that stopping one
# reaps its leader instead of leaving a zombie (and a ResourceWarning) behind.
_children: dict[int, subprocess.Popen] = {}


def track_child(process: subprocess.Popen) -> None:
    """Remember a ``ray start`` this process launched, so that :func:`reap` can collect it later."""
    _children[process.pid] = process


def reap(pid: int) -> None:
    """Collect the exit status of a leader this process launched (no-op for any other pid)."""
    process = _children.pop(pid, None)
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            process.wait(timeout=5)


def psutil_module() -> Any:
    """psutil (a dependency of rayjobs), imported on first use so that ``import runner.local`` stays cheap."""
    import psutil

    return psutil


def process_create_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), or None if there is no such process."""
    psutil = psutil_module()
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def leader_is_alive(cluster: LocalCluster) -> bool:
    """Whether the recorded pid is still the cluster's head ``ray start`` (not a reused pid); changes nothing."""
    return _is_live_leader(cluster.pid, cluster.leader_create_time, cluster.temp_dir)


def worker_leader_is_alive(cluster: LocalCluster, worker: WorkerNode) -> bool:
    """Whether a worker node's ``ray start`` still runs (not a reused pid); changes nothing."""
    return _is_live_leader(worker.pid, worker.leader_create_time, cluster.temp_dir)


def _is_live_leader(pid: int, create_time: float | None, temp_dir: str) -> bool:
    psutil = psutil_module()
    try:
        leader = psutil.Process(pid)
        if leader.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(leader.create_time() - create_time) > 1.0:
            return False
        return any(temp_dir in part for part in leader.cmdline())
    except psutil.Error:
        return False


def _cluster_sessions(cluster: LocalCluster, leader_alive: bool) -> dict[int, bool]:
    """Session ids that can only be the cluster's, each with whether its leader still runs.

    Linux does not hand out a pid while it still names a session, so while a leader's pid is
    unused its session id can only mean our cluster. If some other live program holds that pid
    now, the session is theirs.
    """
    leaders = [(cluster.pid, leader_alive)]
    leaders += [(worker.pid, worker_leader_is_alive(cluster, worker)) for worker in cluster.worker_nodes]
    return {pid: alive for pid, alive in leaders if alive or not _pid_held_by_other_process(pid)}


def cluster_processes(cluster: LocalCluster, leader_alive: bool | None = None) -> list[Any]:
    """Live processes (``psutil.Process``) that belong to the cluster.

    Args:
        cluster: the cluster's record.
        leader_alive: whether its leader still runs, if the caller already knows.

    Returns:
        Processes in the sessions of the head's or a worker node's leader, or whose command line
        names the cluster's temp dir; never this process or its parent.
    """
    psutil = psutil_module()
    if leader_alive is None:
        leader_alive = leader_is_alive(cluster)
    own_pids = {os.getpid(), os.getppid()}
    sessions = _cluster_sessions(cluster, leader_alive)
    # Not a bare substring test: /tmp/rj-abc must not match /tmp/rj-abcd.
    temp_dir_pattern = re.compile(re.escape(cluster.temp_dir) + r"(?![\w.-])")
    members = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        pid = proc.info["pid"]
        if pid in own_pids:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            session = os.getsid(pid)
        except (OSError, psutil.Error):
            continue
        in_session = session in sessions
        if in_session and not sessions[session]:
            # Belt and braces against a pid reused between the check above and this scan.
            created = proc.info.get("create_time") or 0.0
            in_session = created >= cluster.started_at - _CREATE_TIME_SLACK_S
        mentions_temp_dir = any(temp_dir_pattern.search(part) for part in (proc.info.get("cmdline") or []))
        if in_session or mentions_temp_dir:
            members.append(proc)
    return members


def _pid_held_by_other_process(pid: int) -> bool:
    psutil = psutil_module()
    try:
        # A zombie is our own dead leader waiting to be reaped.
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_cluster_processes(cluster: LocalCluster, leader_alive: bool, timeout_s: float) -> bool:
    """Shut the cluster down in order, then kill whatever of it is left.

    Worker nodes go first, so that no raylet is left waiting for a GCS that is gone.

    Args:
        cluster: the cluster's record.
        leader_alive: whether its head ``ray start`` leader still runs (it then gets SIGTERM
            after the worker nodes' leaders, and the rest of ``timeout_s`` to stop Ray's daemons
            itself).
        timeout_s: how long the orderly part may take.

    Returns:
        True if any process of the cluster was running.
    """
    psutil = psutil_module()
    deadline = Deadline(max(timeout_s, 0.0))
    members = cluster_processes(cluster, leader_alive=leader_alive)
    if not members and not leader_alive:
        return False
    live_workers = [worker.pid for worker in cluster.worker_nodes if worker_leader_is_alive(cluster, worker)]
    _terminate_leaders(live_workers, deadline)
    if leader_alive:
        _terminate_leaders([cluster.pid], deadline)
    # Workers, drivers and helpers that outlived the leaders get a short grace
    # period, then SIGKILL.
    remaining = cluster_processes(cluster)
    if remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(cluster.pid, signal.SIGTERM)
        for session in _cluster_sessions(cluster, leader_is_alive(cluster)):
            if session != cluster.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(session, signal.SIGTERM)
        for proc in remaining:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        psutil.wait_procs(remaining, timeout=min(_STRAGGLER_GRACE_S, max(deadline.left(), 0.0)))
    for _ in range(_KILL_ROUNDS):
        leftovers = cluster_processes(cluster)
        if not leftovers:
            break
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(leftovers, timeout=3)
    return True


def _terminate_leaders(pids: list[int], deadline: Deadline) -> None:
    """SIGTERM to each ``ray start --block`` leader, then wait for all of them until ``deadline``."""
    psutil = psutil_module()
    # On SIGTERM `ray start --block` stops its daemons in order (raylet
    # before GCS) in a few seconds. Signalling the whole group at once makes
    # them wait on each other for half a minute instead.
    leaders = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(psutil.Error):
            leaders.append(psutil.Process(pid))
    if leaders:
        psutil.wait_procs(leaders, timeout=max(deadline.left(), 0.0))
