"""What goes wrong with a local cluster, each with the exit code the ``rayjobs`` command uses for it."""

from __future__ import annotations

from runner.errors import BadInput, RayJobsError
from runner.errors import ExitCode


class ClusterError(RayJobsError):
    """A local cluster could not be started, found or stopped.

    Exit code 4 (``CLUSTER_UNREACHABLE``): there is no cluster to talk to. ``rayjobs cluster up``
    and ``rayjobs submit --local`` both end with it when the start fails.
    """

    exit_code = ExitCode.CLUSTER_UNREACHABLE


class InvalidClusterRequest(ClusterError, BadInput):
    """A cluster name or start option that cannot be used (``--name 'bad name!'``). Exit code 2 (``BAD_INPUT``)."""

    exit_code = ExitCode.BAD_INPUT
