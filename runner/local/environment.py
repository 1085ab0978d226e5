"""The environment of a local cluster's processes, and of the processes that talk to it.

Token authentication is on by default. A random token is written (mode 0600) to
``$RAYJOBS_HOME/clusters/<name>/auth_token`` and Ray is started with ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH`` pointing at it, so the GCS, raylet, dashboard, job agent, workers and job
drivers all use that token. The user's ``~/.ray/auth_token`` is never read or written.

What a client needs (checked against Ray 2.60):

* HTTP (REST calls, ``ray.job_submission.JobSubmissionClient``): the header from
  ``LocalCluster.auth_headers()``, ``Authorization: Bearer <token>``, on every request,
  ``/api/version`` included. Without it the dashboard answers 401, with a wrong token 403.
  ``JobSubmissionClient(url, headers=cluster.auth_headers())`` works with no auth variables in
  the client's environment.
* Instead of the header, the environment from ``loopback_env(cluster)`` (``RAY_AUTH_MODE=token``
  plus ``RAY_AUTH_TOKEN_PATH``) makes Ray's clients add it themselves, but only if it is in place
  before ``ray`` is imported: Ray reads these settings once. ``RAY_AUTH_TOKEN_PATH`` without
  ``RAY_AUTH_MODE=token`` is not enough.
* A process calling ``ray.init(address=cluster.gcs_address)`` must have ``loopback_env(cluster)``
  in its environment; without it the connection is refused.
* Job drivers need nothing: they inherit the token settings from the cluster. ``python`` in an
  entrypoint is the interpreter next to the ``ray`` command that started the cluster (its
  directory leads the cluster's ``PATH``).

A ``RAY_AUTH_TOKEN`` variable outranks ``RAY_AUTH_TOKEN_PATH`` in Ray's token lookup, so it is
removed from the cluster's environment, and a client that relies on ``loopback_env`` must not
carry one either.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jobs.infra.ray_env import RAY_CLIENT_ENV
from runner.local.errors import InvalidClusterRequest
from runner.local.ports import LOOPBACK_HOST
from runner.local.state import LocalCluster

RAY_TRAIN_PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"

# GCS fault tolerance: the head's GCS keeps its tables in this Redis, under this namespace (Ray's own variables).
REDIS_ADDRESS_ENV = "RAY_REDIS_ADDRESS"
STORAGE_NAMESPACE_ENV = "RAY_external_storage_namespace"

_GCS_STORE = re.compile(r"redis://(?P<host>[A-Za-z0-9.-]+):(?P<port>\d{1,5})/?")

# Variables that would point a process at some other cluster, or make it
# present some other token.
_FOREIGN_RAY_ENV = (
    "RAY_ADDRESS",
    "RAY_API_SERVER_ADDRESS",
    "RAY_JOB_HEADERS",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_AUTH_MODE",
    # A Redis named in the caller's shell would make every local cluster keep its GCS there, under one namespace.
    REDIS_ADDRESS_ENV,
    STORAGE_NAMESPACE_ENV,
)


def loopback_env(cluster: LocalCluster | None = None) -> dict[str, str]:
    """Environment additions for every process that talks to a local cluster.

    These must be in the environment before ``ray`` is imported in that process: Ray reads
    them once.

    Args:
        cluster: the cluster talked to; None for only the settings every Ray process here needs.

    Returns:
        Ray's client settings and a ``NO_PROXY`` that covers the loopback address; with a
        cluster also ``RAY_AUTH_MODE`` and, for a token cluster, ``RAY_AUTH_TOKEN_PATH``.
    """
    env = dict(RAY_CLIENT_ENV)
    # An HTTP proxy from the user's environment must never see loopback traffic.
    no_proxy = [
        entry
        for entry in os.environ.get("NO_PROXY", os.environ.get("no_proxy", "")).split(",")
        if entry.strip()
    ]
    for host in (LOOPBACK_HOST, "localhost"):
        if host not in no_proxy:
            no_proxy.append(host)
    env["NO_PROXY"] = env["no_proxy"] = ",".join(no_proxy)
    if cluster is not None:
        if cluster.token_file is not None:
            env["RAY_AUTH_MODE"] = "token"
            env["RAY_AUTH_TOKEN_PATH"] = cluster.token_file
        else:
            env["RAY_AUTH_MODE"] = "disabled"
    return env


def redis_address(gcs_store: str) -> str:
    """The ``HOST:PORT`` Ray is given for a GCS store written ``redis://HOST:PORT``.

    Raises:
        InvalidClusterRequest: any other form.
    """
    match = _GCS_STORE.fullmatch(gcs_store.strip()) if isinstance(gcs_store, str) else None
    if match is None or not 0 < int(match["port"]) < 65536:
        raise InvalidClusterRequest(f"gcs_store must read redis://HOST:PORT, got {gcs_store!r}.")
    return f"{match['host']}:{int(match['port'])}"


def ray_start_env(ray_path: str, gcs_port: int, token_file: Path | None, gcs_store: str | None = None,
                  storage_namespace: str | None = None) -> dict[str, str]:
    """The full environment ``ray start`` runs in; every process of the cluster inherits it.

    Args:
        ray_path: the ``ray`` executable; its directory leads ``PATH``.
        gcs_port: the cluster's GCS port on the loopback address.
        token_file: the cluster's token file, or None to run without authentication.
        gcs_store: the Redis the head's GCS keeps its tables in (``redis://HOST:PORT``), or None: in memory.
        storage_namespace: the cluster's own keys in that Redis.

    Returns:
        This process's environment without anything that points at another cluster or token,
        plus the cluster's own address and auth settings.
    """
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_RAY_ENV}
    env.update(loopback_env())
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # On SIGTERM `ray start --block` would first drain its node, waiting up to 30 s for
    # every job and actor to end (a grace meant for Serve replicas); stopping a local
    # cluster ends them anyway, so its daemons stop at once.
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    # `rayjobs stack` and the follower's stall warning ask the dashboard for a process's stack (py-spy);
    # Ray turns that off unless the head says otherwise. The dashboard listens on loopback only.
    env["RAY_DASHBOARD_ENABLE_PROFILING"] = "1"
    # Ray Train starts a preemption watcher per run (a process of its own, about 2 CPU-s to start) that asks
    # whether a cloud provider is draining a node; nothing drains the nodes of a cluster on this machine.
    env.setdefault(RAY_TRAIN_PREEMPTION_WATCHER_ENV, "0")
    # Job entrypoints say `python ...`; it must be the interpreter that has
    # this Ray installed, even when the caller's virtualenv is not activated.
    ray_bin_dir = str(Path(ray_path).parent)
    path_entries = [entry for entry in env.get("PATH", "").split(os.pathsep) if entry]
    env["PATH"] = os.pathsep.join([ray_bin_dir] + [e for e in path_entries if e != ray_bin_dir])
    # Every process of this cluster (workers included) inherits its own GCS address. Ray
    # code that finds "the" cluster by scanning the machine (Ray Train's placement group
    # cleaner, the state API) otherwise fails as soon as a second cluster runs beside it.
    env["RAY_ADDRESS"] = f"{LOOPBACK_HOST}:{gcs_port}"
    if token_file is not None:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    else:
        # Explicit, so that a ~/.ray/auth_token lying around does not switch
        # token auth on behind the caller's back.
        env["RAY_AUTH_MODE"] = "disabled"
    if gcs_store is not None:
        env[REDIS_ADDRESS_ENV] = redis_address(gcs_store)
        env[STORAGE_NAMESPACE_ENV] = storage_namespace or ""
    return env
