"""Code of any size: a job's local code sent through object storage instead of the dashboard.

The dashboard takes a working_dir as one request body and refuses bodies over 100 MiB with a bare
413. Ray's nodes can fetch a package from ``s3://…/_ray_pkg_<hash>.zip`` themselves, so a job
whose code is larger (or whose spec asks for it) is packaged here with Ray's own packaging code and
put in a bucket, under its content hash: a second submission of the same code uploads nothing. The
KubeRay export ships code the same way (``runner.export.packaging``), and this module only decides
where the code goes.

What the cluster needs: boto3 and smart_open on every node (Ray's runtime environment agent downloads
the package, not the job), and the bucket's credentials and endpoint in the environment the nodes
were started with (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for
MinIO or Ceph), or an instance role. The job's own ``runtime_env.env_vars`` reach the job's
processes only, after the download. ``rayjobs cluster up`` passes the caller's environment on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from rayjobs_agent.storage_location import StorageLocation
from jobs.submission import local_runtime_paths
from jobs.workload_contract import workload_needs
from runner.export.packaging import upload_local_paths

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec

# The dashboard's limit on one upload (aiohttp's client_max_size on the dashboard).
DASHBOARD_UPLOAD_LIMIT_BYTES = 100 * 1024**2


@dataclass(frozen=True)
class CodeDestination:
    """Where a job's local code goes, and why there (said to the user in one line)."""

    uri: str
    reason: str


def code_destination(loaded: LoadedSpec, submission: dict[str, Any],
                     size_of: Callable[[str, list[str]], int]) -> CodeDestination | None:
    """Where the submission's local code is uploaded, or None to send it through the dashboard as usual.

    Args:
        loaded: the validated spec (its ``code_path``, ``record_path`` and workload's storage).
        submission: the ``submit_job`` arguments built from it.
        size_of: bytes a working_dir would upload, given the directory and its excludes.

    Returns:
        The spec's ``code_path`` whenever the job has local code; else, for a working_dir too large for
        the dashboard, the run's own object storage when that is ``s3://``; else None.
    """
    runtime_env = submission.get("runtime_env") or {}
    local = dict(local_runtime_paths(runtime_env))
    if not local:
        return None
    spec = loaded.spec
    if spec.code_path:
        return CodeDestination(spec.code_path, "code_path")
    working_dir = local.get("working_dir")
    # The storage first: sizing walks the whole working_dir, which is only worth it when there is somewhere to go.
    storage = _run_object_storage(loaded)
    if storage is None or working_dir is None or \
            size_of(working_dir, list(runtime_env.get("excludes") or [])) < DASHBOARD_UPLOAD_LIMIT_BYTES:
        return None
    return CodeDestination(f"{storage.rstrip('/')}/rayjobs-code",
                           f"the working_dir is over the dashboard's {DASHBOARD_UPLOAD_LIMIT_BYTES // 2**20} MiB")


def upload_code(submission: dict[str, Any], destination: CodeDestination,
                say: Callable[[str], None]) -> dict[str, Any]:
    """A copy of ``submission`` whose local code is uploaded to ``destination`` and named by its ``s3://`` URIs.

    Raises:
        BadInput, StorageUnreachable, StorageAuthFailed: as :func:`runner.export.packaging.upload_local_paths`;
        nothing has been submitted then.
    """
    say(f"sending the job's code through {destination.uri} ({destination.reason})")
    runtime_env = upload_local_paths(submission.get("runtime_env") or {}, destination.uri, say=say)
    return {**submission, "runtime_env": runtime_env}


def _run_object_storage(loaded: LoadedSpec) -> str | None:
    """The run's ``s3://`` storage (the workload's storage_path or the spec's record_path), if it has one.

    The storage's root rather than the run's own folder, so that runs of the same code share one package.
    """
    candidates = [workload_needs(loaded.workload).shared_locations.get("storage_path"), loaded.spec.record_path]
    for location in candidates:
        if location and StorageLocation.parse(str(location)).is_s3:
            return str(location)
    return None
