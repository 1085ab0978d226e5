"""A private, loopback-only Ray cluster for local development.

``start_local_cluster`` runs ``ray start --head --block`` in a new session with
every port chosen free on 127.0.0.1, so several clusters (other users', other
test sessions') can run side by side on one machine. Only the processes of
that session are ever stopped: there is no machine-wide ``ray stop`` here.

Token authentication is on by default. A random token is written (mode 0600)
to ``$RAYJOBS_HOME/clusters/<name>/auth_token`` and Ray is started with
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` pointing at it, so the GCS,
raylet, dashboard, job agent, workers and job drivers all use that token. The
user's ``~/.ray/auth_token`` is never read or written.

What a client needs (checked against Ray 2.60):

* HTTP (REST calls, ``ray.job_submission.JobSubmissionClient``): the header
  from ``LocalCluster.auth_headers()``, ``Authorization: Bearer <token>``, on
  every request, ``/api/version`` included. Without it the dashboard answers
  401, with a wrong token 403. ``JobSubmissionClient(url,
  headers=cluster.auth_headers())`` works with no auth variables in the
  client's environment.
* Instead of the header, the environment from ``loopback_env(cluster)``
  (``RAY_AUTH_MODE=token`` plus ``RAY_AUTH_TOKEN_PATH``) makes Ray's clients
  add it themselves, but only if it is in place before ``ray`` is imported:
  Ray reads these settings once. ``RAY_AUTH_TOKEN_PATH`` without
  ``RAY_AUTH_MODE=token`` is not enough.
* A process calling ``ray.init(address=cluster.gcs_address)`` must have
  ``loopback_env(cluster)`` in its environment; without it the connection is
  refused.
* Job drivers need nothing: they inherit the token settings from the cluster.
  ``python`` in an entrypoint is the interpreter next to the ``ray`` command
  that started the cluster (its directory leads the cluster's ``PATH``).

A ``RAY_AUTH_TOKEN`` variable outranks ``RAY_AUTH_TOKEN_PATH`` in Ray's token
lookup, so it is removed from the cluster's environment, and a client that
relies on ``loopback_env`` must not carry one either.

This module does not import ``ray`` at import time, to keep CLI start-up fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from jobs import atomic
from jobs.ray_env import RAY_CLIENT_ENV

LOOPBACK_HOST = "127.0.0.1"
DEFAULT_CLUSTER_NAME = "default"

_CLUSTER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_STATE_FILE = "cluster.json"
_TOKEN_FILE = "auth_token"
_LOG_FILE = "ray-start.log"
_LOCK_FILE = ".lock"
_FAILED_START_LOGS = "failed-start-logs"
# Ray puts unix sockets under <temp_dir>/session_<timestamp>_<pid>/sockets/;
# a unix socket path must fit in 107 bytes, so the temp dir lives directly
# under /tmp instead of under RAYJOBS_HOME, which may be arbitrarily deep.
_SHORT_TEMP_ROOT = "/tmp"
_TEMP_DIR_PREFIX = "rj-"
_LOG_TAIL_LINES = 20
_STRAGGLER_GRACE_S = 3.0
# Above Ray's default worker port range (10002-19999), which other clusters
# on this machine may use.
_PORT_POOL_LOW = 20000
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# `ray start` option -> key in LocalCluster.ports. Each of these has a fixed
# default (or a default range) in Ray that would clash with a second cluster
# on the same machine.
_PORT_OPTIONS = {
    "--port": "gcs",
    "--dashboard-port": "dashboard",
    "--ray-client-server-port": "ray_client_server",
    "--dashboard-agent-listen-port": "dashboard_agent_http",
    "--dashboard-agent-grpc-port": "dashboard_agent_grpc",
    "--metrics-export-port": "metrics_export",
    "--runtime-env-agent-port": "runtime_env_agent",
    "--node-manager-port": "node_manager",
    "--object-manager-port": "object_manager",
}

# Variables that would point a process at some other cluster, or make it
# present some other token.
_FOREIGN_RAY_ENV = (
    "RAY_ADDRESS",
    "RAY_API_SERVER_ADDRESS",
    "RAY_JOB_HEADERS",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_AUTH_MODE",
)


class ClusterError(Exception):
    """A local cluster could not be started, found or stopped."""


@dataclass
class LocalCluster:
    """Where a running local cluster listens and how to reach it."""

    name: str
    dashboard_url: str
    gcs_address: str
    pid: int
    temp_dir: str
    token_file: str | None
    log_file: str
    started_at: float
    num_cpus: int | None = None
    ports: dict[str, int] = field(default_factory=dict)
    leader_create_time: float | None = None

    @property
    def auth(self) -> bool:
        """Whether the cluster requires a token."""
        return self.token_file is not None

    def auth_token(self) -> str | None:
        """The cluster's token, or None when token auth is off."""
        if self.token_file is None:
            return None
        try:
            token = Path(self.token_file).read_text().strip()
        except OSError as exc:
            raise ClusterError(
                f"Cannot read the auth token of local cluster '{self.name}' from "
                f"{self.token_file}: {exc.strerror or exc}. Restart the cluster."
            ) from None
        if not token:
            raise ClusterError(
                f"The auth token file {self.token_file} of local cluster "
                f"'{self.name}' is empty. Restart the cluster."
            )
        return token

    def auth_headers(self) -> dict[str, str]:
        """HTTP headers that authenticate against the dashboard (empty without auth)."""
        token = self.auth_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def to_json(self) -> str:
        """Serialise for the state file."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LocalCluster:
        """Parse a state file written by ``to_json``; unknown keys are ignored."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("cluster state is not a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def rayjobs_home() -> Path:
    """Directory for rayjobs' own state: ``$RAYJOBS_HOME`` or ``~/.rayjobs``."""
    configured = os.environ.get("RAYJOBS_HOME")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".rayjobs"


def loopback_env(cluster: LocalCluster | None = None) -> dict[str, str]:
    """Environment additions for every process that talks to a local cluster.

    Without a cluster only the settings every Ray process here needs are
    returned. With one, its auth settings are added: ``RAY_AUTH_MODE`` and,
    for a token cluster, ``RAY_AUTH_TOKEN_PATH``. These must be in the
    environment before ``ray`` is imported in that process.
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


def cluster_dir(name: str = DEFAULT_CLUSTER_NAME) -> Path:
    """Directory holding the state, token and start log of the named cluster."""
    _check_name(name)
    return rayjobs_home() / "clusters" / name


def running_local_cluster(name: str = DEFAULT_CLUSTER_NAME) -> LocalCluster | None:
    """The named cluster if it is running, else None.

    A state file whose leader process is gone (or whose pid now belongs to some
    other program) is stale: it is removed, and leftover processes of that
    cluster are killed, so the name can be used again.
    """
    cluster = _read_state(name)
    if cluster is None:
        return None
    if _leader_is_alive(cluster):
        return cluster
    _kill_cluster_processes(cluster, leader_alive=False, timeout_s=5)
    _forget(cluster)
    return None


def find_local_cluster(name: str) -> LocalCluster | None:
    """The named cluster if it is running, else None; reads state only.

    Unlike ``running_local_cluster`` it never removes a stale state file or kills
    leftovers, so any command that merely talks to a cluster may call it.
    """
    cluster = _peek_state(_state_path(name))
    return cluster if cluster is not None and _leader_is_alive(cluster) else None


def local_clusters() -> list[LocalCluster]:
    """Every running local cluster under ``$RAYJOBS_HOME``, by name; reads state only."""
    return [cluster for cluster in _peek_all_states() if _leader_is_alive(cluster)]


def local_cluster_serving(address: str) -> LocalCluster | None:
    """The running local cluster whose dashboard ``address`` reaches, however it is spelled; reads state only."""
    from jobs.address import dashboard_endpoint

    wanted = dashboard_endpoint(address)
    for cluster in _peek_all_states():
        try:
            serves_it = dashboard_endpoint(cluster.dashboard_url) == wanted
        except ValueError:  # a hand-edited state file; it describes no cluster rayjobs started
            continue
        if serves_it and _leader_is_alive(cluster):
            return cluster
    return None


def start_local_cluster(
    name: str = DEFAULT_CLUSTER_NAME,
    num_cpus: int | None = None,
    auth: bool = True,
    timeout_s: float = 90,
    ray_executable: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> LocalCluster:
    """Start a loopback-only Ray head node and wait until its job API answers.

    ``progress`` (optional) receives short status lines while waiting.
    Raises ClusterError when a cluster of that name is already running, or when
    Ray does not come up within ``timeout_s``; in that case everything that was
    started is killed again.
    """
    _check_name(name)
    if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
        raise ClusterError(f"num_cpus must be a positive whole number, got {num_cpus!r}.")
    if timeout_s <= 0:
        raise ClusterError(f"timeout_s must be positive, got {timeout_s!r}.")
    ray_path = _find_ray_executable(ray_executable)
    directory = cluster_dir(name)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    with _name_lock(directory):
        existing = running_local_cluster(name)
        if existing is not None:
            raise ClusterError(
                f"Local cluster '{name}' is already running at {existing.dashboard_url} "
                f"(pid {existing.pid}); stop it first."
            )
        token_file = _write_new_token(directory / _TOKEN_FILE) if auth else None
        if not auth:
            with contextlib.suppress(FileNotFoundError):
                (directory / _TOKEN_FILE).unlink()
        # Free ports are only reserved until our probe sockets close, so another
        # program may grab one before Ray binds it; one retry with fresh ports
        # covers that race.
        attempts = 2
        for attempt in range(1, attempts + 1):
            try:
                cluster = _launch(
                    name, directory, ray_path, num_cpus, token_file, timeout_s, progress
                )
            except _PortClash as clash:
                if attempt == attempts:
                    raise ClusterError(str(clash)) from None
                continue
            _write_state(cluster)
            shutil.rmtree(directory / _FAILED_START_LOGS, ignore_errors=True)
            return cluster
    raise AssertionError("unreachable")


def stop_local_cluster(name: str = DEFAULT_CLUSTER_NAME, timeout_s: float = 30) -> bool:
    """Stop the named cluster and every process it started.

    Sends SIGTERM to our `ray start` leader, which stops Ray's daemons, and
    waits up to ``timeout_s`` for it. Then whatever of the cluster is left
    (found by session id or by its temp dir on the command line) gets SIGTERM
    and a few seconds' grace, then SIGKILL. Returns False if no cluster of that
    name was running.
    """
    cluster = _read_state(name)
    if cluster is None:
        return False
    leader_alive = _leader_is_alive(cluster)
    killed_any = _kill_cluster_processes(cluster, leader_alive=leader_alive, timeout_s=timeout_s)
    _reap(cluster.pid)
    _forget(cluster)
    return leader_alive or killed_any


# --------------------------------------------------------------------------- start


# Popen objects of clusters started by this process, kept so that stopping one
# reaps its leader instead of leaving a zombie (and a ResourceWarning) behind.
_children: dict[int, subprocess.Popen] = {}


class _PortClash(Exception):
    """Ray could not bind one of the ports picked for it."""


def _launch(
    name: str,
    directory: Path,
    ray_path: str,
    num_cpus: int | None,
    token_file: Path | None,
    timeout_s: float,
    progress: Callable[[str], None] | None,
) -> LocalCluster:
    ports = _free_ports(list(_PORT_OPTIONS.values()))
    temp_dir = tempfile.mkdtemp(prefix=_TEMP_DIR_PREFIX, dir=_short_temp_root())
    log_path = directory / _LOG_FILE
    command = [
        ray_path,
        "start",
        "--head",
        "--block",
        f"--node-ip-address={LOOPBACK_HOST}",
        f"--dashboard-host={LOOPBACK_HOST}",
        "--include-dashboard=true",
        "--disable-usage-stats",
        # Plain text: the log tail ends up in error messages.
        "--log-color=false",
        f"--temp-dir={temp_dir}",
        # 0/0 lets each worker take an ephemeral port instead of the shared
        # default range 10002-19999 that other clusters draw from too.
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]
    command += [f"{option}={ports[key]}" for option, key in _PORT_OPTIONS.items()]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")

    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_RAY_ENV}
    env.update(loopback_env())
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Job entrypoints say `python ...`; it must be the interpreter that has
    # this Ray installed, even when the caller's virtualenv is not activated.
    ray_bin_dir = str(Path(ray_path).parent)
    path_entries = [entry for entry in env.get("PATH", "").split(os.pathsep) if entry]
    env["PATH"] = os.pathsep.join([ray_bin_dir] + [e for e in path_entries if e != ray_bin_dir])
    # Every process of this cluster (workers included) inherits its own GCS address. Ray
    # code that finds "the" cluster by scanning the machine (Ray Train's placement group
    # cleaner, the state API) otherwise fails as soon as a second cluster runs beside it.
    env["RAY_ADDRESS"] = f"{LOOPBACK_HOST}:{ports['gcs']}"
    if token_file is not None:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    else:
        # Explicit, so that a ~/.ray/auth_token lying around does not switch
        # token auth on behind the caller's back.
        env["RAY_AUTH_MODE"] = "disabled"

    started_at = time.time()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=directory,
            start_new_session=True,
        )
    _children[process.pid] = process
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
        leader_create_time=_process_create_time(process.pid),
    )
    try:
        _wait_until_ready(cluster, process, started_at + timeout_s, progress)
    except BaseException as failure:
        # Also on KeyboardInterrupt: a half-started cluster nobody knows about
        # would hold ports and memory until the machine reboots.
        _kill_cluster_processes(cluster, leader_alive=True, timeout_s=5)
        _reap(process.pid)
        kept_logs = _keep_session_logs(temp_dir, directory / _FAILED_START_LOGS)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if not isinstance(failure, ClusterError):
            raise
        message = str(failure)
        if kept_logs is not None:
            message += f" Ray's own logs of this attempt are in {kept_logs}."
        if _log_shows_port_clash(log_path) or _log_shows_port_clash(kept_logs):
            raise _PortClash(message) from None
        raise ClusterError(message) from None
    return cluster


def _keep_session_logs(temp_dir: str, destination: Path) -> Path | None:
    """Copy Ray's logs of a failed start out of the temp dir that is about to go."""
    source = Path(temp_dir) / "session_latest" / "logs"
    shutil.rmtree(destination, ignore_errors=True)
    if not source.is_dir():
        return None
    try:
        shutil.copytree(source, destination, symlinks=False, ignore_dangling_symlinks=True)
    except (OSError, shutil.Error):
        return None
    return destination


def _wait_until_ready(
    cluster: LocalCluster,
    process: subprocess.Popen,
    deadline: float,
    progress: Callable[[str], None] | None,
) -> None:
    """Poll until the dashboard, the job API and the head's job agent answer."""
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
    for label, url, step_headers in steps:
        if progress:
            progress(f"waiting for the {label} of cluster '{cluster.name}'")
        last_status = None
        while True:
            exit_code = process.poll()
            if exit_code is not None:
                raise ClusterError(
                    f"ray start for local cluster '{cluster.name}' exited with code "
                    f"{exit_code} before the {label} was ready. "
                    + _log_tail_sentence(cluster.log_file)
                )
            last_status = _http_status(url, step_headers)
            if last_status == 200:
                break
            if time.time() >= deadline:
                status_note = f" (last HTTP status {last_status})" if last_status else ""
                raise ClusterError(
                    f"Local cluster '{cluster.name}' did not get its {label} ready within "
                    f"{deadline - cluster.started_at:.0f} s{status_note}. "
                    + _log_tail_sentence(cluster.log_file)
                )
            time.sleep(0.25)
    if cluster.auth:
        # Guards against a Ray that silently ignores RAY_AUTH_MODE: a cluster
        # that runs anyone's code must not pretend to be protected.
        anonymous_status = _http_status(f"{cluster.dashboard_url}/api/jobs/", {})
        if anonymous_status not in (401, 403):
            raise ClusterError(
                f"Local cluster '{cluster.name}' accepts job API requests without a "
                f"token (HTTP {anonymous_status}); refusing to run it with auth "
                "switched off silently."
            )


def _http_status(url: str, headers: dict[str, str], timeout_s: float = 2.0) -> int | None:
    """HTTP status of a GET, or None when nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _free_ports(keys: list[str]) -> dict[str, int]:
    """Distinct ports that are free on the loopback address right now.

    They are drawn from below the kernel's ephemeral range: ports in that
    range are handed to every outgoing connection (Ray's own processes make
    hundreds while starting), so a port that was free a moment ago is often
    taken by the time Ray binds it. Ray's default worker range is avoided too.
    """
    low, high = _PORT_POOL_LOW, _ephemeral_port_floor() - 1
    if high - low < 10 * len(keys):
        low, high = 1024, 65535
    rng = random.SystemRandom()
    chosen: dict[str, int] = {}
    taken: set[int] = set()
    for key in keys:
        for _ in range(200):
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


def _short_temp_root() -> str:
    return _SHORT_TEMP_ROOT if os.path.isdir(_SHORT_TEMP_ROOT) else tempfile.gettempdir()


def _write_new_token(path: Path) -> Path:
    """Write a fresh random token readable only by the owner."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    # Created with its final mode: a chmod afterwards would leave a window in
    # which the token is readable by others.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as token_file:
        token_file.write(secrets.token_hex(32))
    return path


def _find_ray_executable(explicit: str | None) -> str:
    if explicit:
        resolved = shutil.which(explicit)
        if resolved is None:
            raise ClusterError(f"The Ray executable '{explicit}' was not found or is not executable.")
        return resolved
    # Prefer the `ray` of the running interpreter's environment, so the
    # cluster runs the same Ray version as the client.
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


def _log_tail(log_file: str, lines: int = _LOG_TAIL_LINES) -> list[str]:
    try:
        text = Path(log_file).read_text(errors="replace")
    except OSError:
        return []
    text = _ANSI_ESCAPE.sub("", text)
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def _log_tail_sentence(log_file: str) -> str:
    tail = _log_tail(log_file)
    if not tail:
        return f"The log {log_file} is empty."
    return f"Last lines of {log_file}: " + " | ".join(tail)


def _log_shows_port_clash(log_path: Path | None) -> bool:
    """Whether `ray start`'s log, or any of Ray's logs in a directory, names a busy port."""
    if log_path is None:
        return False
    paths = sorted(log_path.glob("*.err")) + sorted(log_path.glob("*.out")) if log_path.is_dir() else [log_path]
    text = "\n".join(line for path in paths for line in _log_tail(str(path), lines=200)).lower()
    return any(sign in text for sign in ("already in use", "already occupied", "failed to bind"))


# --------------------------------------------------------------------------- state


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _CLUSTER_NAME_PATTERN.match(name):
        raise ClusterError(
            f"Invalid cluster name {name!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )


def _state_path(name: str) -> Path:
    return cluster_dir(name) / _STATE_FILE


def _write_state(cluster: LocalCluster) -> None:
    path = _state_path(cluster.name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic.write_text(path, cluster.to_json(), durable=True)


def _read_state(name: str) -> LocalCluster | None:
    path = _state_path(name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ClusterError(f"Cannot read the state of local cluster '{name}' at {path}: {exc.strerror or exc}.") from None
    try:
        return LocalCluster.from_json(text)
    except (ValueError, TypeError):
        # An unreadable state file cannot describe a running cluster we could
        # manage; dropping it lets the name be used again.
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None


def _peek_state(path: Path) -> LocalCluster | None:
    """The state at ``path``, or None when it is missing or unreadable; never changes anything."""
    try:
        return LocalCluster.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return None


def _peek_all_states() -> Iterator[LocalCluster]:
    for path in sorted((rayjobs_home() / "clusters").glob(f"*/{_STATE_FILE}")):
        cluster = _peek_state(path)
        if cluster is not None:
            yield cluster


def _forget(cluster: LocalCluster) -> None:
    """Remove the state file and the cluster's temp dir."""
    with contextlib.suppress(FileNotFoundError):
        _state_path(cluster.name).unlink()
    if _is_our_temp_dir(cluster.temp_dir):
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def _is_our_temp_dir(path: str) -> bool:
    # The state file is plain JSON on disk; never let it steer rmtree anywhere
    # but a directory shaped like the ones this module creates.
    candidate = Path(path)
    return (
        candidate.is_absolute()
        and candidate.name.startswith(_TEMP_DIR_PREFIX)
        and str(candidate.parent) in {_SHORT_TEMP_ROOT, tempfile.gettempdir()}
    )


@contextlib.contextmanager
def _name_lock(directory: Path) -> Iterator[None]:
    """Serialise starts of the same cluster name across processes."""
    import fcntl

    with open(directory / _LOCK_FILE, "a") as lock_file:
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise ClusterError(
                f"Local cluster '{directory.name}' is being started by another process."
            ) from None
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------- processes


def _reap(pid: int) -> None:
    process = _children.pop(pid, None)
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            process.wait(timeout=5)


def _psutil() -> Any:
    """psutil, falling back to the copy that Ray ships inside its package."""
    try:
        import psutil
    except ImportError:
        import importlib.util

        spec = importlib.util.find_spec("ray")
        if spec is None or not spec.submodule_search_locations:
            raise
        vendored = os.path.join(list(spec.submodule_search_locations)[0], "thirdparty_files")
        if vendored not in sys.path:
            sys.path.append(vendored)
        import psutil
    return psutil


def _process_create_time(pid: int) -> float | None:
    psutil = _psutil()
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _leader_is_alive(cluster: LocalCluster) -> bool:
    """Whether the recorded pid is still our `ray start` (not a reused pid)."""
    psutil = _psutil()
    try:
        leader = psutil.Process(cluster.pid)
        if leader.status() == psutil.STATUS_ZOMBIE:
            return False
        if cluster.leader_create_time is not None and abs(leader.create_time() - cluster.leader_create_time) > 1.0:
            return False
        return any(cluster.temp_dir in part for part in leader.cmdline())
    except psutil.Error:
        return False


def cluster_processes(cluster: LocalCluster, leader_alive: bool | None = None) -> list[Any]:
    """Live processes (psutil.Process) that belong to the cluster.

    A process belongs to it when it is in the session of our `ray start`
    leader, or when its command line mentions the cluster's private temp dir
    (Ray's daemons do; they may have left the session).
    """
    psutil = _psutil()
    if leader_alive is None:
        leader_alive = _leader_is_alive(cluster)
    own_pids = {os.getpid(), os.getppid()}
    # Linux does not hand out a pid while it still names a session, so while
    # the leader's pid is unused its session id can only mean our cluster.
    # If some other live program holds that pid now, the session is theirs.
    match_session = leader_alive or not _pid_held_by_other_process(cluster.pid)
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
            in_session = match_session and os.getsid(pid) == cluster.pid
        except (OSError, psutil.Error):
            continue
        if in_session and not leader_alive:
            # Belt and braces against a pid reused between the check above
            # and this scan: cluster members were all born after its start.
            created = proc.info.get("create_time") or 0.0
            in_session = created >= cluster.started_at - 2.0
        mentions_temp_dir = any(temp_dir_pattern.search(part) for part in (proc.info.get("cmdline") or []))
        if in_session or mentions_temp_dir:
            members.append(proc)
    return members


def _pid_held_by_other_process(pid: int) -> bool:
    psutil = _psutil()
    try:
        # A zombie is our own dead leader waiting to be reaped.
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_cluster_processes(cluster: LocalCluster, leader_alive: bool, timeout_s: float) -> bool:
    """Shut the cluster down, killing whatever is left. True if anything was running."""
    psutil = _psutil()
    deadline = time.monotonic() + max(timeout_s, 0.0)
    members = cluster_processes(cluster, leader_alive=leader_alive)
    if not members and not leader_alive:
        return False
    if leader_alive:
        # On SIGTERM `ray start --block` stops its daemons in order (raylet
        # before GCS) in a few seconds. Signalling the whole group at once makes
        # them wait on each other for half a minute instead.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(cluster.pid, signal.SIGTERM)
        with contextlib.suppress(psutil.Error):
            psutil.Process(cluster.pid).wait(timeout=max(deadline - time.monotonic(), 0.0))
    # Workers, drivers and helpers that outlived the leader get a short grace
    # period, then SIGKILL.
    remaining = cluster_processes(cluster)
    if remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(cluster.pid, signal.SIGTERM)
        for proc in remaining:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        grace_s = min(_STRAGGLER_GRACE_S, max(deadline - time.monotonic(), 0.0))
        psutil.wait_procs(remaining, timeout=grace_s)
    for _ in range(3):
        leftovers = cluster_processes(cluster)
        if not leftovers:
            break
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(leftovers, timeout=3)
    return True
