"""What can go wrong on the client side, and the exit code the ``rayjobs`` command gives each outcome.

The library raises; only the CLI decides what to print.
"""

from __future__ import annotations

from jobs.errors import BadInput, ExitCode, RayJobsError
from jobs.infra.status import JobStatus

# BadInput, ExitCode and RayJobsError are defined with the spec's errors, which a workload imports too.
__all__ = ["AuthFailed", "BadInput", "ClusterRequestFailed", "ClusterUnreachable", "ExitCode", "JobNotFound",
           "NoCluster", "NoLogApi", "NotADashboard", "ProfilingDisabled", "RayJobsError", "TERMINAL_STATUS_CODES",
           "exit_code_for_status"]


TERMINAL_STATUS_CODES = {
    JobStatus.SUCCEEDED: ExitCode.SUCCEEDED,
    JobStatus.FAILED: ExitCode.FAILED,
    JobStatus.STOPPED: ExitCode.STOPPED,
}


def exit_code_for_status(status: str) -> ExitCode:
    """The exit code for a job status; a job still PENDING or RUNNING maps to 0."""
    return TERMINAL_STATUS_CODES.get(status, ExitCode.SUCCEEDED)


class ClusterUnreachable(RayJobsError):
    """No (usable) answer from the cluster; worth retrying for a while."""

    exit_code = ExitCode.CLUSTER_UNREACHABLE


class NotADashboard(ClusterUnreachable):
    """Something answered, but not Ray's job API (an HTML page, a proxy's error page)."""


class NoLogApi(NotADashboard):
    """The dashboard does not serve this way of reading a job's log (an older Ray, or not a submission job)."""


class ClusterRequestFailed(RayJobsError):
    """The cluster understood the request and failed it (an internal error on its side)."""

    exit_code = ExitCode.CLUSTER_UNREACHABLE


class ProfilingDisabled(ClusterRequestFailed):
    """The cluster's dashboard does not read process stacks: profiling is off on its head node."""


class AuthFailed(RayJobsError):
    """The cluster refused the credentials, or wanted some."""

    exit_code = ExitCode.AUTH_FAILED


class JobNotFound(RayJobsError):
    """The cluster has no job with the id asked for."""

    exit_code = ExitCode.NOT_FOUND


class NoCluster(ClusterUnreachable):
    """No address given anywhere and no local cluster running."""
