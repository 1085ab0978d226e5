"""The exceptions rayjobs raises on the client side; each carries its exit code.

The library raises; only the CLI decides what to print.
"""

from __future__ import annotations

from runner.exit_codes import ExitCode


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


class AuthFailed(RayJobsError):
    """The cluster refused the credentials, or wanted some."""

    exit_code = ExitCode.AUTH_FAILED


class JobNotFound(RayJobsError):
    """The cluster has no job with the id asked for."""

    exit_code = ExitCode.NOT_FOUND


class NoCluster(ClusterUnreachable):
    """No address given anywhere and no local cluster running."""
