"""What can go wrong on the client side, and the exit code the ``rayjobs`` command gives each outcome.

The library raises; only the CLI decides what to print.
"""

from __future__ import annotations

from enum import IntEnum

from jobs.infra.status import JobStatus


class ExitCode(IntEnum):
    """What a ``rayjobs`` command exits with; "Exit codes" in docs/troubleshooting.md explains each."""

    SUCCEEDED = 0
    FAILED = 1  # the job ran and failed (or, for `stop`, could not be stopped)
    BAD_INPUT = 2  # a spec, flag or argument is wrong; nothing was submitted
    STOPPED = 3  # the job was stopped (by a user, or by rayjobs on request)
    CLUSTER_UNREACHABLE = 4  # no answer from the cluster, or the job's state is unknown
    TIMEOUT = 5  # timeout_s / start_timeout_s ran out and rayjobs stopped the job
    NOT_FOUND = 6  # no job with that id
    AUTH_FAILED = 7  # the cluster refused our credentials (or wanted some)
    INTERRUPTED = 130  # Ctrl-C while following: rayjobs detached, the job keeps running


TERMINAL_STATUS_CODES = {
    JobStatus.SUCCEEDED: ExitCode.SUCCEEDED,
    JobStatus.FAILED: ExitCode.FAILED,
    JobStatus.STOPPED: ExitCode.STOPPED,
}


def exit_code_for_status(status: str) -> ExitCode:
    """The exit code for a job status; a job still PENDING or RUNNING maps to 0."""
    return TERMINAL_STATUS_CODES.get(status, ExitCode.SUCCEEDED)


class RayJobsError(Exception):
    """Base class: a problem with a one-paragraph message and an exit code."""

    exit_code: ExitCode = ExitCode.FAILED


class BadInput(RayJobsError):
    """A spec, flag, argument or request the cluster refused as malformed; nothing was submitted."""

    exit_code = ExitCode.BAD_INPUT


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
