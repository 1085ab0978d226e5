"""Exit codes of the rayjobs command, one per outcome a script may want to tell apart."""

from __future__ import annotations

from enum import IntEnum

from jobs.status import JobStatus


class ExitCode(IntEnum):
    """What a ``rayjobs`` command exits with; the README's "Exit codes" table explains each."""

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
