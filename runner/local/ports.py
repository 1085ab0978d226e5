"""Picking the ports of a local cluster: every one Ray would otherwise take from a fixed default."""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

from runner.local.errors import ClusterError

LOOPBACK_HOST = "127.0.0.1"

# `ray start` option -> key in LocalCluster.ports. Each of these has a fixed
# default (or a default range) in Ray that would clash with a second cluster,
# or a second node, on the same machine.
HEAD_ONLY_PORT_OPTIONS = {
    "--port": "gcs",
    "--dashboard-port": "dashboard",
    "--ray-client-server-port": "ray_client_server",
}
# The ports every node binds for itself, head and worker nodes alike.
NODE_PORT_OPTIONS = {
    "--dashboard-agent-listen-port": "dashboard_agent_http",
    "--dashboard-agent-grpc-port": "dashboard_agent_grpc",
    "--metrics-export-port": "metrics_export",
    "--runtime-env-agent-port": "runtime_env_agent",
    "--node-manager-port": "node_manager",
    "--object-manager-port": "object_manager",
}
RAY_PORT_OPTIONS = {**HEAD_ONLY_PORT_OPTIONS, **NODE_PORT_OPTIONS}

# Above Ray's default worker port range (10002-19999), which other clusters
# on this machine may use.
_PORT_POOL_LOW = 20000
_DRAWS_PER_PORT = 200


def free_ports(keys: list[str], avoid: set[int] | frozenset[int] = frozenset()) -> dict[str, int]:
    """Distinct ports that are free on the loopback address right now.

    They are drawn from below the kernel's ephemeral range: ports in that
    range are handed to every outgoing connection (Ray's own processes make
    hundreds while starting), so a port that was free a moment ago is often
    taken by the time Ray binds it. Ray's default worker range is avoided too.

    Args:
        keys: one name per port wanted.
        avoid: ports not to hand out even if they are free now (promised to another node).

    Returns:
        Each key with its port.

    Raises:
        ClusterError: no free port turned up in many random draws.
    """
    low, high = _PORT_POOL_LOW, _ephemeral_port_floor() - 1
    if high - low < 10 * len(keys):
        low, high = 1024, 65535
    rng = random.SystemRandom()
    chosen: dict[str, int] = {}
    taken: set[int] = set(avoid)
    for key in keys:
        for _ in range(_DRAWS_PER_PORT):
            port = rng.randint(low, high)
            if port not in taken and _port_is_free(port):
                break
        else:
            raise ClusterError(f"Could not find a free port on {LOOPBACK_HOST} between {low} and {high}.")
        chosen[key] = port
        taken.add(port)
    return chosen


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK_HOST, port))
        except OSError:
            return False
    # Ray binds some servers on the IPv6 wildcard (dual-stack); a port held
    # there by someone else is not free either.
    if socket.has_ipv6:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("::1", port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False
    return True


def _ephemeral_port_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
