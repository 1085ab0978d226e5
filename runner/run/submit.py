"""Sending a spec's job: the pre-flight checks, the code upload, and attaching when the same spec already started it.

A fixed ``submission_id`` makes submitting idempotent: a second ``rayjobs submit`` of the same spec
follows the job the first one started, and a job of another spec under that id is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TextIO

from jobs.keys import METADATA_SPEC_HASH
from jobs.queueing import queue_needs
from runner.client.submission import SubmitInterrupted, working_dir_size
from runner.errors import BadInput, ClusterRequestFailed, JobNotFound
from runner.run.code_upload import code_destination, upload_code
from runner.follow.messages import where_from
from runner.run.interrupts import settle_interrupted_submit
from runner.run.notes import Notes
from runner.run.preflight import check_entrypoint_fits, check_queue_fits, check_sweep_fits
from runner.run.record_note import no_record_note

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec
    from runner.client.jobs_api import JobsApi


def submit_or_attach(client: JobsApi, submission: dict[str, Any], *, name: str, preflight: bool = True,
                     notes: TextIO | None = None, loaded: LoadedSpec | None = None) -> str:
    """Submit a job; with a fixed ``submission_id`` already taken by the same spec, attach to that job instead.

    Args:
        client: the cluster client.
        submission: keyword arguments of ``submit_job`` (``jobs.submission.build_submission``).
        name: the job's name, for the message that it was submitted.
        preflight: first refuse an entrypoint that no node of the cluster can host (and the spec's sweep, when
            ``loaded`` is given, if the cluster holds none of its trials or fewer at once than it asks for).
        loaded: the spec the submission was built from.
        notes: where rayjobs' own lines go (default: stderr).

    Returns:
        The submission id of the new or the attached job.

    Raises:
        BadInput: the id is taken by a job with another spec hash, or no node can host the entrypoint.
        SubmitInterrupted: Ctrl-C once submitting began; it tells whether the job request had gone out.
        KeyboardInterrupt: Ctrl-C before that (in the attach check or the pre-flight): nothing was submitted.
        RayJobsError: the cluster could not be reached, refused the credentials, or failed the request.
    """
    say = Notes(notes).say
    wanted = submission.get("submission_id")
    if wanted and _attach_if_submitted(client, wanted, submission, say):
        return wanted
    if preflight:
        check_entrypoint_fits(client, submission, warn=lambda text: say(f"warning: {text}"))
        if loaded is not None:
            check_sweep_fits(client, loaded, warn=lambda text: say(f"warning: {text}"))
            if loaded.spec.queue is not None:
                check_queue_fits(client, queue_needs(loaded), loaded.spec.queue,
                                 warn=lambda text: say(f"warning: {text}"))
    destination = code_destination(loaded, submission, working_dir_size) if loaded is not None else None
    if destination is not None:
        submission = upload_code(submission, destination, say)
    try:
        job_id = client.submit(submission, warn=lambda text: say(f"warning: {text}"), progress=say)
    except (BadInput, ClusterRequestFailed):
        # Submitters of one spec started at once all find the id free, and all but one are refused:
        # the one that got in is the job the others attach to, as they would a moment later.
        if wanted and _attach_if_submitted(client, wanted, submission, say):
            return wanted
        raise
    try:
        say(f"submitted {name} as {job_id} to {client.address} ({where_from(client.connection)})")
    except KeyboardInterrupt:  # the job exists; the caller must not report it as never submitted
        raise SubmitInterrupted(job_id, answered=True) from None
    if loaded is not None and (note := no_record_note(loaded, submission)) is not None:
        say(f"note: {note}")  # the first attempt only: retries are submitted without ``loaded``
    return job_id


def _attach_if_submitted(client: JobsApi, wanted: str, submission: dict[str, Any],
                         say: Callable[[str], None]) -> bool:
    """Whether a job ``wanted`` from this same spec exists (then it is attached to); BadInput when another spec has it."""
    try:
        existing = client.get_job(wanted)
    except JobNotFound:
        return False
    ours = submission["metadata"][METADATA_SPEC_HASH]
    theirs = (existing.get("metadata") or {}).get(METADATA_SPEC_HASH)
    if theirs != ours:
        raise BadInput(
            f"submission_id {wanted!r} is already taken by a job with different content (spec hash "
            f"{theirs or 'none: not submitted by rayjobs'}, this spec {ours}); change submission_id, or "
            f"delete the old job first (rayjobs delete {wanted})")
    say(f"job {wanted} was already submitted from this spec ({existing.get('status')}); attaching to it")
    return True


def submit_settling_interrupts(client: JobsApi, submission: dict[str, Any], name: str, *, preflight: bool,
                               stop_on_interrupt: bool, notes: TextIO | None, attempts: list[str],
                               loaded: LoadedSpec | None = None) -> str | None:
    """``submit_or_attach``, its id appended to ``attempts``; on Ctrl-C, settle it and return None."""
    try:
        job_id = submit_or_attach(client, submission, name=name, preflight=preflight, notes=notes, loaded=loaded)
    except SubmitInterrupted as interrupted:
        created = settle_interrupted_submit(client, interrupted, stop_it=stop_on_interrupt, notes=notes)
    except KeyboardInterrupt:  # in the attach check or the pre-flight: before any job request
        created = settle_interrupted_submit(client, SubmitInterrupted(None), stop_it=stop_on_interrupt, notes=notes)
    else:
        attempts.append(job_id)
        return job_id
    if created is not None:
        attempts.append(created)
    return None
