"""Launching ``ray start --head --block`` for one local cluster and waiting until it serves jobs.

The ``ray`` executable is, in this order: the one the caller names, ``$RAYJOBS_RAY_EXECUTABLE``,
the one next to this Python (so the cluster runs the client's Ray version), the one on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from runner.backoff import Backoff, Deadline
from jobs.infra.http import Unanswered, fetch
from runner.local.environment import ray_start_env
from runner.local.errors import ClusterError
from runner.local.ports import LOOPBACK_HOST, RAY_PORT_OPTIONS, free_ports
from runner.local.processes import process_create_time, reap, stop_cluster_processes, track_child
from runner.local.state import FAILED_START_LOGS, LOG_FILE, LocalCluster, new_temp_dir

RAY_EXECUTABLE_ENV_VAR = "RAYJOBS_RAY_EXECUTABLE"

_LOG_TAIL_LINES = 20
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# How often readiness is polled: soon at first, easing off while Ray boots.
_READY_POLL_FIRST_S = 0.1
_READY_POLL_MAX_S = 0.5
_HTTP_PROBE_TIMEOUT_S = 2.0
# Time a failed start gets to take its own processes down.
_CLEANUP_TIMEOUT_S = 5


class TransientStartFailure(ClusterError):
    """A start that failed for a reason a second try on fresh ports may not meet again.

    Two such reasons show in Ray's logs: another program took a port picked for Ray before Ray
    bound it, or a node did not register with the GCS within the 30 s Ray allows itself, which
    happens when the machine is busy.
    """


def find_ray_executable(explicit: str | None = None) -> str:
    """The ``ray`` command to start clusters with.

    Args:
        explicit: a command name or path that overrides the search.

    Returns:
        Its absolute path.

    Raises:
        ClusterError: it was not found or is not executable.
    """
    explicit = explicit or os.environ.get(RAY_EXECUTABLE_ENV_VAR) or None
    if explicit:
        resolved = shutil.which(explicit)
        if resolved is None:
            raise ClusterError(f"The Ray executable '{explicit}' was not found or is not executable.")
        return resolved
    sibling = Path(sys.executable).parent / "ray"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which("ray")
    if found is None:
        raise ClusterError(
            "The 'ray' command was not found next to this Python or on PATH; "
            "install ray[default] in this environment."
        )
    return found


def ray_start_command(
    ray_path: str,
    temp_dir: str,
    ports: dict[str, int],
    num_cpus: int | None,
    object_store_memory: int | None = None,
) -> list[str]:
    """The ``ray start`` command line of a head bound to the loopback address on ``ports``."""
    command = [
        ray_path,
        "start",
        "--head",
        "--block",
        f"--node-ip-address={LOOPBACK_HOST}",
        f"--dashboard-host={LOOPBACK_HOST}",
        "--include-dashboard=true",
        "--disable-usage-stats",
    ]
    return command + node_options(temp_dir, ports, RAY_PORT_OPTIONS, num_cpus, object_store_memory)


def node_options(temp_dir: str, ports: dict[str, int], port_options: dict[str, str], num_cpus: int | None,
                 object_store_memory: int | None) -> list[str]:
    """The ``ray start`` options every node of a local cluster gets, the head and worker nodes alike."""
    options = [
        # Plain text: the log tail ends up in error messages.
        "--log-color=false",
        f"--temp-dir={temp_dir}",
        # 0/0 lets each worker take an ephemeral port instead of the shared default range
        # 10002-19999 that other clusters (and the other nodes of this one) draw from too.
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]
    options += [f"{option}={ports[key]}" for option, key in port_options.items()]
    if num_cpus is not None:
        options.append(f"--num-cpus={num_cpus}")
    if object_store_memory is not None:
        options.append(f"--object-store-memory={object_store_memory}")
    return options


def launch(
    name: str,
    directory: Path,
    ray_path: str,
    num_cpus: int | None,
    token_file: Path | None,
    timeout_s: float,
    progress: Callable[[str], None] | None = None,
    object_store_memory: int | None = None,
    gcs_store: str | None = None,
    storage_namespace: str | None = None,
    again: LocalCluster | None = None,
) -> LocalCluster:
    """Run ``ray start --head`` on fresh ports (or those of ``again``) and wait until its job API answers.

    On any failure (Ctrl-C included) everything that was started is killed again and its temp
    dir removed; Ray's own logs of the attempt are kept in ``directory/failed-start-logs``.

    Args:
        name: the cluster's name.
        directory: the cluster's own directory (start log, token, kept logs).
        ray_path: the ``ray`` executable.
        num_cpus: CPUs the cluster offers, or None for all.
        token_file: the token file for token auth, or None for none.
        timeout_s: how long Ray may take to come up.
        progress: receives short status lines while waiting.
        object_store_memory: bytes of the head's object store, or None for Ray's default.
        gcs_store: the Redis the head keeps its GCS in (``redis://HOST:PORT``), or None.
        storage_namespace: the cluster's keys in that Redis.
        again: the record of this cluster's head that died: it is started again on the same ports and temp
            dir (whose logs a failed start leaves in place), so that clients and Ray's own records of it
            find it where they were.

    Returns:
        The running cluster's record (not yet written to its state file).

    Raises:
        TransientStartFailure: Ray's logs say a port was taken before it could bind it, or
            its node did not register in time.
        ClusterError: Ray exited, or was not ready within ``timeout_s``.
    """
    ports = dict(again.ports) if again is not None else free_ports(list(RAY_PORT_OPTIONS.values()))
    temp_dir = again.temp_dir if again is not None else new_temp_dir()
    log_path = directory / LOG_FILE
    env = ray_start_env(ray_path, ports["gcs"], token_file, gcs_store, storage_namespace)
    started_at = time.time()
    deadline = Deadline(timeout_s)
    with open(log_path, "ab" if again is not None else "wb") as log:
        process = subprocess.Popen(
            ray_start_command(ray_path, temp_dir, ports, num_cpus, object_store_memory),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=directory,
            start_new_session=True,
        )
    track_child(process)
    cluster = LocalCluster(
        name=name,
        dashboard_url=f"http://{LOOPBACK_HOST}:{ports['dashboard']}",
        gcs_address=f"{LOOPBACK_HOST}:{ports['gcs']}",
        pid=process.pid,
        temp_dir=temp_dir,
        token_file=str(token_file) if token_file is not None else None,
        log_file=str(log_path),
        started_at=started_at,
        num_cpus=num_cpus,
        ports=ports,
        leader_create_time=process_create_time(process.pid),
        object_store_memory=object_store_memory,
        gcs_store=gcs_store,
        storage_namespace=storage_namespace,
    )
    try:
        wait_until_ready(cluster, process, deadline, progress)
    except BaseException as failure:
        # Also on KeyboardInterrupt: a half-started cluster nobody knows about
        # would hold ports and memory until the machine reboots.
        stop_cluster_processes(cluster, leader_alive=True, timeout_s=_CLEANUP_TIMEOUT_S)
        reap(process.pid)
        kept_logs = keep_session_logs(temp_dir, directory / FAILED_START_LOGS)
        if again is None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        if not isinstance(failure, ClusterError):
            raise
        message = str(failure)
        if kept_logs is not None:
            message += f" Ray's own logs of this attempt are in {kept_logs}."
        if log_shows_transient_failure(log_path) or log_shows_transient_failure(kept_logs):
            raise TransientStartFailure(message) from None
        raise ClusterError(message) from None
    return cluster


def wait_until_ready(
    cluster: LocalCluster,
    process: subprocess.Popen,
    deadline: Deadline,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Poll until the dashboard, the job API and the head's job agent answer.

    Args:
        cluster: the record of the cluster being started.
        process: its ``ray start`` leader.
        deadline: when to give up.
        progress: receives a line as each part is waited for.

    Raises:
        ClusterError: ``ray start`` exited, the deadline passed, or a token cluster answers
            without the token.
    """
    headers = cluster.auth_headers()
    agent_url = f"http://{LOOPBACK_HOST}:{cluster.ports['dashboard_agent_http']}"
    steps = [
        # Under token auth even /api/version wants the token.
        ("dashboard", f"{cluster.dashboard_url}/api/version", headers),
        ("job API", f"{cluster.dashboard_url}/api/jobs/", headers),
        # Job submission goes through the head node's agent; the dashboard
        # answers before it is up, and then submissions time out.
        ("job agent", f"{agent_url}/api/healthz", {}),
    ]
    backoff = Backoff(first_s=_READY_POLL_FIRST_S, max_s=_READY_POLL_MAX_S)
    for label, url, step_headers in steps:
        if progress:
            progress(f"waiting for the {label} of cluster '{cluster.name}'")
        backoff.reset()
        while True:
            exit_code = process.poll()
            if exit_code is not None:
                raise ClusterError(
                    f"ray start for local cluster '{cluster.name}' exited with code "
                    f"{exit_code} before the {label} was ready. "
                    + log_tail_sentence(cluster.log_file)
                )
            last_status = http_status(url, step_headers)
            if last_status == 200:
                break
            if deadline.left() <= 0:
                status_note = f" (last HTTP status {last_status})" if last_status else ""
                raise ClusterError(
                    f"Local cluster '{cluster.name}' did not get its {label} ready within "
                    f"{deadline.seconds:.0f} s{status_note}. "
                    + log_tail_sentence(cluster.log_file)
                )
            time.sleep(min(backoff.next_delay(), max(deadline.left(), 0.0)))
    if cluster.auth:
        # Guards against a Ray that silently ignores RAY_AUTH_MODE: a cluster
        # that runs anyone's code must not pretend to be protected.
        anonymous_status = http_status(f"{cluster.dashboard_url}/api/jobs/", {})
        if anonymous_status not in (401, 403):
            raise ClusterError(
                f"Local cluster '{cluster.name}' accepts job API requests without a "
                f"token (HTTP {anonymous_status}); refusing to run it with auth "
                "switched off silently."
            )


def http_status(url: str, headers: dict[str, str]) -> int | None:
    """HTTP status of a GET, or None when nothing answers."""
    try:
        return fetch(url, headers=headers, timeout_s=_HTTP_PROBE_TIMEOUT_S).status
    except (Unanswered, ValueError):
        return None


def keep_session_logs(temp_dir: str, destination: Path) -> Path | None:
    """Copy Ray's logs of a failed start out of the temp dir that is about to go; None when there are none."""
    source = Path(temp_dir) / "session_latest" / "logs"
    shutil.rmtree(destination, ignore_errors=True)
    if not source.is_dir():
        return None
    try:
        shutil.copytree(source, destination, symlinks=False, ignore_dangling_symlinks=True)
    except (OSError, shutil.Error):
        return None
    return destination


def _log_tail(log_file: str, lines: int = _LOG_TAIL_LINES) -> list[str]:
    try:
        text = Path(log_file).read_text(errors="replace")
    except OSError:
        return []
    text = _ANSI_ESCAPE.sub("", text)
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def log_tail_sentence(log_file: str) -> str:
    """The last lines of a log as one sentence for an error message."""
    tail = _log_tail(log_file)
    if not tail:
        return f"The log {log_file} is empty."
    return f"Last lines of {log_file}: " + " | ".join(tail)


# What Ray writes when a port was taken under it, or when its node did not register in time.
_TRANSIENT_FAILURE_SIGNS = (
    "already in use",
    "already occupied",
    "failed to bind",
    "timed out during startup",
)


def log_shows_transient_failure(log_path: Path | None) -> bool:
    """Whether `ray start`'s log, or any of Ray's logs in a directory, shows a failure a retry may not meet."""
    if log_path is None:
        return False
    paths = sorted(log_path.glob("*.err")) + sorted(log_path.glob("*.out")) if log_path.is_dir() else [log_path]
    text = "\n".join(line for path in paths for line in _log_tail(str(path), lines=200)).lower()
    return any(sign in text for sign in _TRANSIENT_FAILURE_SIGNS)
