"""What rayjobs records about a local cluster, and where: names, the state file, its lock, the token file.

Each cluster lives in ``$RAYJOBS_HOME/clusters/<name>/``: ``cluster.json`` (a :class:`LocalCluster`),
``auth_token`` (mode 0600), ``ray-start.log`` and a lock file that serialises starts of that name.
Functions named ``peek_*`` only read; the others may also drop a state file that can describe no
running cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from jobs.infra import atomic
from runner.local.errors import ClusterError, InvalidClusterRequest

DEFAULT_CLUSTER_NAME = "default"
STATE_FILE = "cluster.json"
TOKEN_FILE = "auth_token"
LOG_FILE = "ray-start.log"
FAILED_START_LOGS = "failed-start-logs"
_LOCK_FILE = ".lock"
_CLUSTER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Ray puts unix sockets under <temp_dir>/session_<timestamp>_<pid>/sockets/;
# a unix socket path must fit in 107 bytes, so the temp dir lives directly
# under /tmp instead of under RAYJOBS_HOME, which may be arbitrarily deep.
_SHORT_TEMP_ROOT = "/tmp"
_TEMP_DIR_PREFIX = "rj-"


@dataclass
class WorkerNode:
    """One worker node of a local cluster: its own ``ray start --address=…`` in a session of its own."""

    name: str
    pid: int
    log_file: str
    ports: dict[str, int] = field(default_factory=dict)
    leader_create_time: float | None = None


@dataclass
class LocalCluster:
    """Where a running local cluster listens and how to reach it.

    ``pid`` is the head node's ``ray start`` leader; ``worker_nodes`` are the other nodes
    (none for a single-node cluster).
    """

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
    worker_nodes: list[WorkerNode] = field(default_factory=list)
    object_store_memory: int | None = None
    # GCS fault tolerance: the head keeps its GCS (Ray's job table, actors, key-value store) in this Redis
    # (``redis://HOST:PORT``), under ``storage_namespace``, one per cluster started fresh. Its record then outlives
    # a head that died, so that the next start brings it back on the same ports and the same store.
    gcs_store: str | None = None
    storage_namespace: str | None = None

    @property
    def node_count(self) -> int:
        """How many nodes the cluster was started with, the head included."""
        return 1 + len(self.worker_nodes)

    @property
    def auth(self) -> bool:
        """Whether the cluster requires a token."""
        return self.token_file is not None

    def auth_token(self) -> str | None:
        """The cluster's token, or None when token auth is off.

        Raises:
            ClusterError: the token file is missing, unreadable or empty.
        """
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
        """Parse a state file written by ``to_json``; unknown keys are ignored.

        Raises:
            ValueError: the text is not a JSON object.
            TypeError: a field the record needs is missing.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("cluster state is not a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {key: value for key, value in data.items() if key in known}
        workers = fields.get("worker_nodes") or []
        if not isinstance(workers, list) or not all(isinstance(worker, dict) for worker in workers):
            raise ValueError("worker_nodes is not a list of objects")
        worker_known = {f.name for f in dataclasses.fields(WorkerNode)}
        fields["worker_nodes"] = [
            WorkerNode(**{key: value for key, value in worker.items() if key in worker_known}) for worker in workers
        ]
        return cls(**fields)


def rayjobs_home() -> Path:
    """Directory for rayjobs' own state: ``$RAYJOBS_HOME`` or ``~/.rayjobs``."""
    configured = os.environ.get("RAYJOBS_HOME")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".rayjobs"


def check_name(name: str) -> None:
    """Refuse a name that is not safe as a directory name.

    Raises:
        InvalidClusterRequest: the name is empty, too long, or has other characters than
            letters, digits, '.', '_' and '-' (or starts with one of the last three).
    """
    if not isinstance(name, str) or not _CLUSTER_NAME_PATTERN.match(name):
        raise InvalidClusterRequest(
            f"Invalid cluster name {name!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )


def cluster_dir(name: str = DEFAULT_CLUSTER_NAME) -> Path:
    """Directory holding the state, token and start log of the named cluster.

    Raises:
        InvalidClusterRequest: ``name`` is not a valid cluster name.
    """
    check_name(name)
    return rayjobs_home() / "clusters" / name


def state_path(name: str) -> Path:
    """Where the state file of the named cluster lives."""
    return cluster_dir(name) / STATE_FILE


def write_state(cluster: LocalCluster) -> None:
    """Record a started cluster; a reader sees the old file or the new one, never half of one."""
    path = state_path(cluster.name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic.write_text(path, cluster.to_json(), durable=True)


def read_state(name: str) -> LocalCluster | None:
    """The recorded state of the named cluster; an unreadable state file is removed.

    Returns:
        The record, or None when there is none (or it was garbled and has been removed).

    Raises:
        ClusterError: the file exists but cannot be read (permissions, I/O error).
    """
    path = state_path(name)
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


def peek_state(name: str) -> LocalCluster | None:
    """The recorded state of the named cluster, or None when it is missing or unreadable; changes nothing."""
    return _peek_file(state_path(name))


def peek_all_states() -> Iterator[LocalCluster]:
    """Every readable state file under ``$RAYJOBS_HOME``, in name order; changes nothing."""
    for path in sorted((rayjobs_home() / "clusters").glob(f"*/{STATE_FILE}")):
        cluster = _peek_file(path)
        if cluster is not None:
            yield cluster


def _peek_file(path: Path) -> LocalCluster | None:
    try:
        return LocalCluster.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return None


def forget_state(cluster: LocalCluster) -> None:
    """Remove the state file and the cluster's temp dir."""
    with contextlib.suppress(FileNotFoundError):
        state_path(cluster.name).unlink()
    if _is_our_temp_dir(cluster.temp_dir):
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def new_temp_dir() -> str:
    """A fresh, private temp dir for one cluster, with a path short enough for Ray's unix sockets."""
    root = _SHORT_TEMP_ROOT if os.path.isdir(_SHORT_TEMP_ROOT) else tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=_TEMP_DIR_PREFIX, dir=root)


def _is_our_temp_dir(path: str) -> bool:
    # The state file is plain JSON on disk; never let it steer rmtree anywhere
    # but a directory shaped like the ones new_temp_dir creates.
    candidate = Path(path)
    return (
        candidate.is_absolute()
        and candidate.name.startswith(_TEMP_DIR_PREFIX)
        and str(candidate.parent) in {_SHORT_TEMP_ROOT, tempfile.gettempdir()}
    )


@contextlib.contextmanager
def name_lock(directory: Path) -> Iterator[None]:
    """Hold the start lock of the cluster whose files are in ``directory``, across processes.

    Raises:
        ClusterError: another process holds it (it is starting that cluster).
    """
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


def write_new_token(path: Path) -> Path:
    """Write a fresh random token at ``path``, readable only by the owner, and return ``path``."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    # Created with its final mode: a chmod afterwards would leave a window in
    # which the token is readable by others.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as token_file:
        token_file.write(secrets.token_hex(32))
    return path
