"""What Ctrl-C does to a run: detach from the job or stop it, and say whether a job was created at all.

A job outlives the terminal that submitted it, so an interrupt never leaves the user guessing: each
path ends with a line that says where the job is and the command that reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from runner.errors import ExitCode, JobNotFound, RayJobsError
from runner.follow.messages import address_hint, follow_up_lines
from runner.follow.queued import job_or_place
from runner.reporter import Reporter

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi
    from runner.client.submission import SubmitInterrupted


def detach_or_stop(client: JobsApi, job_id: str, *, stop_it: bool, notes: TextIO | None = None) -> ExitCode:
    """After Ctrl-C: leave the job running and say how to reach it, or (``stop_it``) ask the cluster to stop it.

    Returns:
        ExitCode.INTERRUPTED. A failed stop is reported, never raised.
    """
    say = Reporter(notes).say
    hint = address_hint(client.connection)
    if not stop_it:
        say(f"interrupted: detached from job {job_id}, which keeps running on the cluster")
        for line in follow_up_lines(job_id, client.connection):
            say(line)
        return ExitCode.INTERRUPTED
    say(f"interrupted: stopping job {job_id} (--stop-on-interrupt)")
    from runner.client.queue import stop_job

    try:
        stop_job(client, job_id)
        say(f"stop requested; check with: rayjobs status {job_id}{hint}")
    except RayJobsError as exc:
        say(f"could not stop it: {exc}")
    return ExitCode.INTERRUPTED


def settle_interrupted_submit(client: JobsApi, interrupted: SubmitInterrupted, *, stop_it: bool,
                              notes: TextIO | None = None) -> str | None:
    """After Ctrl-C while submitting: say whether the job was created, and where it is now.

    When the job request had gone out but its answer had not come back, the cluster is asked.

    Returns:
        The id of the job that was (or may have been) created, or None if nothing was submitted.
    """
    say = Reporter(notes).say
    job_id = interrupted.submission_id
    if job_id is None:
        say("interrupted: nothing was submitted")
        return None
    hint = address_hint(client.connection)
    if not interrupted.answered:
        # The job request had gone out; only the cluster knows whether it created the job.
        try:
            job_or_place(client, job_id)
        except JobNotFound:
            say(f"interrupted: nothing was submitted (the cluster has no job {job_id}; "
                f"`rayjobs status {job_id}{hint}` checks again)")
            return None
        except (RayJobsError, KeyboardInterrupt):
            say(f"interrupted: the request to submit job {job_id} had gone out, but whether the cluster created "
                f"it is unknown; check with `rayjobs status {job_id}{hint}`")
            return job_id
    if stop_it:
        detach_or_stop(client, job_id, stop_it=True, notes=notes)
        return job_id
    say(f"interrupted: job {job_id} was submitted and keeps running; follow it with "
        f"`rayjobs logs --follow {job_id}{hint}`, stop it with `rayjobs stop {job_id}{hint}`")
    return job_id
