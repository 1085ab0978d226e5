"""Sending a spec's job: the pre-flight checks, the code upload, and attaching when the same spec already started it.

A fixed ``submission_id`` makes submitting idempotent: a second ``rayjobs submit`` of the same spec
follows the job the first one started, and a job of another spec under that id is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TextIO

from rayjobs_agent.wire import METADATA_SPEC_HASH
from jobs.queueing import queue_needs
from rayjobs_agent.package import agent_modules_sent
from runner.client.queue import ClusterQueue
from runner.client.submission import SubmitInterrupted, new_submission_id, working_dir_size
from runner.errors import BadInput, ClusterRequestFailed, JobNotFound, RayJobsError
from runner.run.code_upload import code_destination, upload_code
from runner.follow.messages import where_from
from runner.run.interrupts import settle_interrupted_submit
from runner.reporter import Reporter
from runner.run.preflight import check_entrypoint_fits, check_queue_fits, check_sweep_fits
from runner.run.record_note import no_record_note

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec
    from runner.client.jobs_api import JobsApi


def submit_or_attach(client: JobsApi, submission: dict[str, Any], *, name: str, preflight: bool = True,
                     notes: TextIO | None = None, loaded: LoadedSpec | None = None,
                     queue: dict[str, Any] | None = None, await_place: bool = True) -> str:
    """Submit a job; with a fixed ``submission_id`` already taken by the same spec, attach to that job instead.

    Args:
        client: the cluster client.
        submission: keyword arguments of ``submit_job`` (``jobs.submission.build_submission``).
        name: the job's name, for the message that it was submitted.
        preflight: first refuse an entrypoint that no node of the cluster can host (and the spec's sweep, when
            ``loaded`` is given, if the cluster holds none of its trials or fewer at once than it asks for).
        loaded: the spec the submission was built from.
        notes: where rayjobs' own lines go (default: stderr).
        queue: the job's place in a cluster queue (``jobs.queueing.queue_config``): its request is then kept by
            the queue, which submits it to Ray when its turn comes.
        await_place: for a queued job, wait for the queue's answer and say the job's place; without it, return
            once the queue has taken the order (``--no-wait``).

    Returns:
        The submission id of the new or the attached job.

    Raises:
        BadInput: the id is taken by a job with another spec hash, or no node can host the entrypoint.
        SubmitInterrupted: Ctrl-C once submitting began; it tells whether the job request had gone out.
        KeyboardInterrupt: Ctrl-C before that (in the attach check or the pre-flight): nothing was submitted.
        RayJobsError: the cluster could not be reached, refused the credentials, or failed the request.
    """
    say = Reporter(notes).say
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
    # The agent's own package, as listed before its code may be sent through object storage: the stand-in of a
    # waiting job that never runs needs the agent, wherever the package went.
    local_modules = list((submission.get("runtime_env") or {}).get("py_modules") or [])
    destination = code_destination(loaded, submission, working_dir_size) if loaded is not None else None
    if destination is not None:
        submission = upload_code(submission, destination, say)
    if queue is not None:
        return _enqueue(client, submission, name, queue, say, loaded, local_modules, await_place)
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


def _enqueue(client: JobsApi, submission: dict[str, Any], name: str, queue: dict[str, Any],
             say: Callable[[str], None], loaded: LoadedSpec | None, local_modules: list[str], await_place: bool) -> str:
    """Put the job's request (its code uploaded) into its cluster queue; the job's id."""
    submission = {**submission, "submission_id": submission.get("submission_id") or new_submission_id()}
    job_id = submission["submission_id"]
    try:
        request = client.prepare(submission, warn=lambda text: say(f"warning: {text}"), progress=say)
    except KeyboardInterrupt:
        raise SubmitInterrupted(None) from None
    sent_modules = (request.get("runtime_env") or {}).get("py_modules") or []
    agent_modules = agent_modules_sent(local_modules, sent_modules)
    try:
        answer = ClusterQueue(client).enqueue(request, queue=queue["name"], priority=int(queue.get("priority") or 0),
                                              needs=queue.get("needs") or {}, name=name, agent_modules=agent_modules,
                                              wait=await_place, grows=queue.get("grows") or [])
    except (KeyboardInterrupt, SubmitInterrupted) as interrupted:
        raise _enqueue_interrupted(client, job_id, interrupted) from None
    if "exists" in answer:
        _same_spec_or_refuse(job_id, submission, answer.get("metadata") or {},
                             answer.get("status") or f"waiting in queue {answer.get('queue')}", say)
        return job_id
    where = f"submitted {name} as {job_id} to {client.address} ({where_from(client.connection)})"
    if "position" in answer:
        limit = answer.get("max_running")
        say(f"{where}: waiting in queue {answer['queued']}, position {answer.get('position')} "
            f"({answer.get('running')} of {limit if limit is not None else 'unlimited'} running)")
    else:
        say(f"{where}: queued in {answer['queued']} (`rayjobs status {job_id}` shows its place)")
    if loaded is not None and (note := no_record_note(loaded, submission)) is not None:
        say(f"note: {note}")
    return job_id


def _enqueue_interrupted(client: JobsApi, job_id: str, interrupted: BaseException) -> SubmitInterrupted:
    """Ctrl-C while job ``job_id``'s order to enter its queue went out or was answered, settled for good: an order
    still on its way (a slow network, a proxy) must not enter the job after the user was told nothing was submitted,
    so its id is taken by an order that withdraws the job, unless the order is in Ray's table already."""
    if isinstance(interrupted, SubmitInterrupted) and interrupted.submission_id is None:
        return SubmitInterrupted(None)  # the order had not gone out
    try:
        withdrawn = ClusterQueue(client).withdraw(job_id)
    except (RayJobsError, KeyboardInterrupt):
        return SubmitInterrupted(job_id, answered=False)  # the cluster is asked what became of it, and says so
    return SubmitInterrupted(None) if withdrawn else SubmitInterrupted(job_id, answered=True)


def _attach_if_submitted(client: JobsApi, wanted: str, submission: dict[str, Any],
                         say: Callable[[str], None]) -> bool:
    """Whether a job ``wanted`` from this same spec exists, running or queued (then it is attached to); BadInput
    when another spec has it."""
    try:
        existing = client.get_job(wanted)
    except JobNotFound:
        # A waiting job's order to enter its queue holds its id, with its spec's hash, for as long as it waits.
        entry = ClusterQueue(client).entry_of(wanted)
        if entry is None:
            return False

        existing = {"status": f"waiting in queue {entry.get('queue')}", "metadata": entry.get("metadata") or {}}
    _same_spec_or_refuse(wanted, submission, existing.get("metadata") or {}, existing.get("status"), say)
    return True


def _same_spec_or_refuse(wanted: str, submission: dict[str, Any], metadata: dict[str, Any], status: Any,
                         say: Callable[[str], None]) -> None:
    """Say that job ``wanted`` came from this spec (and is attached to), or refuse: another spec's job has the id."""
    ours = submission["metadata"][METADATA_SPEC_HASH]
    theirs = metadata.get(METADATA_SPEC_HASH)
    if theirs != ours:
        raise BadInput(
            f"submission_id {wanted!r} is already taken by a job with different content (spec hash "
            f"{theirs or 'none: not submitted by rayjobs'}, this spec {ours}); change submission_id, or "
            f"delete the old job first (rayjobs delete {wanted})")
    say(f"job {wanted} was already submitted from this spec ({status}); attaching to it")


def submit_settling_interrupts(client: JobsApi, submission: dict[str, Any], name: str, *, preflight: bool,
                               stop_on_interrupt: bool, notes: TextIO | None, attempts: list[str],
                               loaded: LoadedSpec | None = None, queue: dict[str, Any] | None = None,
                               await_place: bool = True) -> str | None:
    """``submit_or_attach``, its id appended to ``attempts``; on Ctrl-C, settle it and return None."""
    try:
        job_id = submit_or_attach(client, submission, name=name, preflight=preflight, notes=notes, loaded=loaded,
                                  queue=queue, await_place=await_place)
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
