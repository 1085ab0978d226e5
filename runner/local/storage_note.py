"""The note ``rayjobs submit`` prints when a job on a multi-node local cluster writes to local paths."""

from __future__ import annotations

import json
from typing import Any

from jobs.keys import WORKLOAD_ENV_VAR
from jobs.object_store import uri_scheme
from runner.local import find_running

# Workload parameters (dotted paths in the workload section) that every node of a job writes to
# or reads from: Ray Train's run storage, and the vision workload's preprocessed shards.
SHARED_PATH_PARAMETERS = ("storage_path", "data.output_dir")


def is_local_path(value: str) -> bool:
    """Whether a storage location is a path on one machine's disk rather than object storage (``s3://…``)."""
    return uri_scheme(value) in (None, "file")


def local_shared_paths(submission: dict[str, Any]) -> dict[str, str]:
    """The workload parameters among :data:`SHARED_PATH_PARAMETERS` that a submission sets to local paths."""
    env_vars = (submission.get("runtime_env") or {}).get("env_vars") or {}
    try:
        params = json.loads(env_vars.get(WORKLOAD_ENV_VAR) or "{}")
    except ValueError:
        return {}
    found: dict[str, str] = {}
    for dotted in SHARED_PATH_PARAMETERS:
        value: Any = params
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value and is_local_path(value):
            found[dotted] = value
    return found


def shared_storage_note(local_cluster: str | None, submission: dict[str, Any]) -> str | None:
    """One line for stderr when a multi-node local cluster gets a job whose shared storage is a local path.

    On this machine all nodes share the disk, so the job works; on a real cluster each node has
    its own disk. Reads the cluster's state only.

    Args:
        local_cluster: the name of the local cluster the job goes to, or None for any other cluster.
        submission: the keyword arguments of ``submit_job`` (the workload travels in its env vars).

    Returns:
        The note, or None when there is nothing to say.
    """
    if local_cluster is None:
        return None
    cluster = find_running(local_cluster)
    if cluster is None or cluster.node_count <= 1:
        return None
    paths = local_shared_paths(submission)
    if not paths:
        return None
    named = " and ".join(f"workload.{key} ({value})" for key, value in paths.items())
    one = len(paths) == 1
    return (
        f"local cluster '{cluster.name}' has {cluster.node_count} nodes and {named} "
        f"{'is a local path' if one else 'are local paths'}: fine here, where all nodes share this machine's "
        f"disk, but on a real multi-node cluster {'it' if one else 'they'} must be a shared mount or object "
        "storage (s3://, gs://)"
    )
