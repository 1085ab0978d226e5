"""Running a spec's job to its end: submit (or attach), follow, and retry per the spec's policy.

The ``rayjobs submit`` command is a thin layer over these functions; a notebook, an Airflow
task or a test calls them the same way. They take the cluster client (``runner.client.jobs_api.JobsApi``,
or anything with its methods) and two text streams: ``logs_out`` for the job's log and
``notes`` for rayjobs' own ``rayjobs: …`` lines. Outcomes come back as a ``RunResult``; only
a problem nobody can fix by waiting (a bad spec, refused credentials) is raised.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, TextIO

from jobs.keys import METADATA_ATTEMPT, METADATA_PARENT, METADATA_SPEC_HASH
from jobs.status import JobStatus, is_terminal
from jobs.submission import build_submission
from runner.client.backoff import Deadline, retrying
from runner.errors import BadInput, ClusterRequestFailed, ExitCode, JobNotFound, RayJobsError
from runner.follow.follower import DEFAULT_GIVE_UP_S, Follower, Outcome
from runner.follow.diagnosis import Diagnosis
from runner.follow.log_view import ANSI_ESCAPE
from runner.follow.progress import RunProgress
from runner.follow.retry_policy import decide_retry, wait_before_retry
from runner.follow.watching import Watch
from runner.client.preflight import check_entrypoint_fits, check_queue_fits, check_sweep_fits, entrypoint_demand
from runner.follow.messages import address_hint, follow_up_lines, summary_line, where_from
from runner.client.submission import SubmitInterrupted, working_dir_size
from jobs.queueing import queue_needs
from runner.follow.code_upload import code_destination, upload_code

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec
    from runner.client.jobs_api import JobsApi

LOG_TAIL_LINES = 10


class RunOutcome(str, Enum):
    """How a run ended, in words; ``RunResult.exit_code`` says the same as a number."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    TIMED_OUT = "timed_out"  # timeout_s or start_timeout_s passed; rayjobs stopped the job
    STATE_UNKNOWN = "state_unknown"  # contact lost for longer than give_up_after_s; the job may still run
    INTERRUPTED = "interrupted"  # Ctrl-C: detached (or stopped with stop_on_interrupt)
    SUBMITTED = "submitted"  # submitted and not followed (``wait=False``)


_OUTCOME_OF_CODE = {
    ExitCode.SUCCEEDED: RunOutcome.SUCCEEDED,
    ExitCode.FAILED: RunOutcome.FAILED,
    ExitCode.STOPPED: RunOutcome.STOPPED,
    ExitCode.TIMEOUT: RunOutcome.TIMED_OUT,
    ExitCode.CLUSTER_UNREACHABLE: RunOutcome.STATE_UNKNOWN,
    ExitCode.INTERRUPTED: RunOutcome.INTERRUPTED,
}


@dataclass
class RunResult:
    """What became of a run: its exit code, every attempt's job id (oldest first), and how it ended."""

    exit_code: ExitCode
    outcome: RunOutcome
    attempts: list[str] = field(default_factory=list)
    # The follower's account of the last attempt; None when it was not followed to an end.
    followed: Outcome | None = None
    summary: str = ""
    # What the job's progress events said (last metrics, iterations, attempts, restarts with reasons).
    progress: RunProgress = field(default_factory=RunProgress)
    # Why the last attempt failed, when its log shows a known cause (runner.follow.diagnosis).
    diagnosis: Diagnosis | None = None

    @property
    def job_id(self) -> str | None:
        """The last attempt's submission id (None if nothing was submitted)."""
        return self.attempts[-1] if self.attempts else None

    @property
    def info(self) -> dict[str, Any] | None:
        """Ray's last record of the last attempt (status, times, message, error type), if it was followed."""
        return self.followed.info if self.followed is not None else None


@dataclass(frozen=True)
class RunOptions:
    """How to run: the flags of ``rayjobs submit`` that are not about the spec or the cluster."""

    wait: bool = True  # follow the job to its end (False: return once it is submitted)
    stream_logs: bool = True
    give_up_after_s: float = DEFAULT_GIVE_UP_S
    stop_on_interrupt: bool = False  # on Ctrl-C, stop the job instead of detaching from it
    preflight: bool = True  # refuse an entrypoint that no node can host
    summaries: bool = True  # print each attempt's summary line (and a failed one's log tail) to ``notes``
    raw: bool = False  # the log exactly as written: Ray's own lines and the progress events too
    live: bool | None = None  # a live status block (None: when stdout and stderr are both terminals)


class _Notes:
    """rayjobs' own lines, to a stream chosen when they are written (so a redirected stderr is honoured)."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out

    def write(self, text: str) -> None:
        out = self._out or sys.stderr
        out.write(text + "\n")
        out.flush()

    def say(self, text: str) -> None:
        self.write(f"rayjobs: {text}")


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
    say = _Notes(notes).say
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
    return job_id


def _attach_if_submitted(client: JobsApi, wanted: str, submission: dict[str, Any], say: Any) -> bool:
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


def run_with_retries(client: JobsApi, loaded: LoadedSpec, *, options: RunOptions | None = None,
                     notes: TextIO | None = None, logs_out: TextIO | None = None) -> RunResult:
    """Submit (or attach), follow to the end, and submit again while the spec's retry policy says so.

    Each retry gets metadata ``rayjobs.attempt`` (its number) and ``rayjobs.parent`` (the first
    attempt's id), and ``<submission_id>-attemptN`` as its id when the spec fixes one.

    Args:
        client: the cluster client.
        loaded: the validated spec (``jobs.loader.load_spec``); its policy (timeouts, max_retries, retry_on)
            runs the job, its ``submit_job`` arguments are built from it.
        options: how to run (default ``RunOptions()``: follow, stream the log, detach on Ctrl-C).
        notes: where rayjobs' own lines go (default: stderr).
        logs_out: where the job's log goes (default: stdout).

    Returns:
        The result; its ``exit_code`` is what ``rayjobs submit`` exits with. Ctrl-C is reported as an
        INTERRUPTED result, after saying whether a job was created.

    Raises:
        BadInput: a submission_id taken by another spec, or an entrypoint no node can host.
        RayJobsError: the cluster could not be reached, refused the credentials, or failed a request.
    """
    options = options or RunOptions()
    spec = loaded.spec
    submission = build_submission(loaded)
    metadata = dict(submission.get("metadata") or {})
    if spec.max_retries:
        metadata[METADATA_ATTEMPT] = "1"
    submission = {**submission, "metadata": metadata}
    attempts: list[str] = []
    job_id = _submit_settling_interrupts(client, submission, spec.name, options.preflight, options, notes, attempts,
                                         loaded=loaded)
    if job_id is None:
        return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts)
    if not options.wait:
        if spec.timeout_s or spec.start_timeout_s or spec.max_retries:
            _Notes(notes).say("note: timeout_s, start_timeout_s and max_retries are applied only while rayjobs "
                              "follows the job")
        return RunResult(ExitCode.SUCCEEDED, RunOutcome.SUBMITTED, attempts)
    while True:
        result = follow_job(client, job_id, options=options, timeout_s=spec.timeout_s,
                            start_timeout_s=spec.start_timeout_s, demand=entrypoint_demand(submission),
                            stall_after_s=spec.stall_after_s,
                            notes=notes, logs_out=logs_out)
        result.attempts = attempts
        info = result.info or {}
        if result.exit_code != ExitCode.FAILED:
            return result
        decision = decide_retry(spec, info, result.diagnosis, len(attempts))
        if decision.note:
            _Notes(notes).say(decision.note)
        if not decision.retry:
            return result
        if not wait_before_retry(decision.delay_s):
            _Notes(notes).say(f"interrupted while waiting to retry: no attempt {len(attempts) + 1} was submitted")
            return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts, progress=result.progress)
        attempt = len(attempts) + 1
        retry = dict(submission, metadata={**metadata, METADATA_ATTEMPT: str(attempt), METADATA_PARENT: attempts[0]})
        if spec.submission_id:
            retry["submission_id"] = f"{spec.submission_id}-attempt{attempt}"
        job_id = _submit_settling_interrupts(client, retry, spec.name, False, options, notes, attempts)
        if job_id is None:
            return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts)


def follow_job(client: JobsApi, job_id: str, *, options: RunOptions | None = None, timeout_s: float | None = None,
               start_timeout_s: float | None = None, demand: dict[str, float] | None = None,
               stall_after_s: float | None = None,
               log_tail_on_failure: bool = True, notes: TextIO | None = None,
               logs_out: TextIO | None = None) -> RunResult:
    """Follow one job to its end, stopping it when a timeout passes; Ctrl-C detaches (or stops it).

    Args:
        client: the cluster client.
        job_id: the submission id.
        options: ``stream_logs``, ``give_up_after_s``, ``stop_on_interrupt`` and ``summaries`` apply.
        timeout_s: stop the job once it has run this long (exit code TIMEOUT).
        start_timeout_s: stop the job if it is still PENDING after this long (exit code TIMEOUT).
        demand: the entrypoint's resources, named when the start timeout passes.
        stall_after_s: warn (with stacks) when the RUNNING job is silent this long; None: from its pace.
        log_tail_on_failure: with ``options.summaries``, print the last lines of a FAILED job's log.
        notes: where rayjobs' own lines go (default: stderr).
        logs_out: where the job's log goes (default: stdout).

    Returns:
        The result, with ``attempts == [job_id]``.

    Raises:
        JobNotFound, AuthFailed: on the first status call.
    """
    options = options or RunOptions()
    watch = Watch(client, job_id, logs_out or sys.stdout, notes or sys.stderr, raw=options.raw, live=options.live,
                  stream_logs=options.stream_logs, stall_after_s=stall_after_s)
    notes, progress = watch.notes, watch.progress
    out = _Notes(notes)
    follower = Follower(client, job_id, logs_out=watch.view, notes=notes, stream_logs=options.stream_logs,
                        give_up_after_s=options.give_up_after_s, timeout_s=timeout_s, start_timeout_s=start_timeout_s,
                        demand=demand, stall_after=watch.stall_after if options.stream_logs else None,
                        on_stall=watch.on_stall, activity=watch.last_activity, on_quiet=watch.on_quiet)
    try:
        followed = follower.run()
    except KeyboardInterrupt:
        watch.close()
        detach_or_stop(client, job_id, stop_it=options.stop_on_interrupt, notes=notes)
        return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, [job_id], progress=progress)
    watch.close()
    summary = summary_line(job_id, followed.exit_code, followed.info, followed.reason, watch.waiting_text())
    diagnosis = watch.failure.diagnose(progress) if followed.status == JobStatus.FAILED else None
    if options.summaries:
        out.say(summary)
        if diagnosis is not None:
            out.say(f"why: {diagnosis.paragraph()}")
        if log_tail_on_failure and followed.status == JobStatus.FAILED and followed.log_tail:
            out.say("last lines of its log:")
            for line in followed.log_tail[-LOG_TAIL_LINES:]:
                out.write(f"  | {ANSI_ESCAPE.sub('', line)}")
    return RunResult(followed.exit_code, _OUTCOME_OF_CODE[followed.exit_code], [job_id], followed, summary,
                     progress, diagnosis)


def detach_or_stop(client: JobsApi, job_id: str, *, stop_it: bool, notes: TextIO | None = None) -> ExitCode:
    """After Ctrl-C: leave the job running and say how to reach it, or (``stop_it``) ask the cluster to stop it.

    Returns:
        ExitCode.INTERRUPTED. A failed stop is reported, never raised.
    """
    say = _Notes(notes).say
    hint = address_hint(client.connection)
    if not stop_it:
        say(f"interrupted: detached from job {job_id}, which keeps running on the cluster")
        for line in follow_up_lines(job_id, client.connection):
            say(line)
        return ExitCode.INTERRUPTED
    say(f"interrupted: stopping job {job_id} (--stop-on-interrupt)")
    try:
        client.stop_job(job_id)
        say(f"stop requested; check with: rayjobs status {job_id}{hint}")
    except RayJobsError as exc:
        say(f"could not stop it: {exc}")
    return ExitCode.INTERRUPTED


def wait_until_ended(client: JobsApi, job_id: str, *, within_s: float, poll_s: float = 0.3) -> tuple[str | None, bool]:
    """Poll a job's status until it is SUCCEEDED, FAILED or STOPPED, for at most ``within_s``.

    Returns:
        The last status seen, and whether the job ended in time.

    Raises:
        ClusterUnreachable: no answer for 10 s in a row; any other ``RayJobsError`` at once.
    """
    deadline = Deadline(within_s)
    status: str | None = None
    while deadline.left() > 0:
        status = retrying(lambda: client.get_job(job_id), give_up_after_s=10).get("status")
        if is_terminal(status):
            return status, True
        time.sleep(poll_s)
    return status, False


def settle_interrupted_submit(client: JobsApi, interrupted: SubmitInterrupted, *, stop_it: bool,
                              notes: TextIO | None = None) -> str | None:
    """After Ctrl-C while submitting: say whether the job was created, and where it is now.

    When the job request had gone out but its answer had not come back, the cluster is asked.

    Returns:
        The id of the job that was (or may have been) created, or None if nothing was submitted.
    """
    say = _Notes(notes).say
    job_id = interrupted.submission_id
    if job_id is None:
        say("interrupted: nothing was submitted")
        return None
    hint = address_hint(client.connection)
    if not interrupted.answered:
        # The job request had gone out; only the cluster knows whether it created the job.
        try:
            client.get_job(job_id)
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


def _submit_settling_interrupts(client: JobsApi, submission: dict[str, Any], name: str, preflight: bool,
                                options: RunOptions, notes: TextIO | None, attempts: list[str],
                                loaded: LoadedSpec | None = None) -> str | None:
    """``submit_or_attach``, its id appended to ``attempts``; on Ctrl-C, settle it and return None."""
    try:
        job_id = submit_or_attach(client, submission, name=name, preflight=preflight, notes=notes, loaded=loaded)
    except SubmitInterrupted as interrupted:
        created = settle_interrupted_submit(client, interrupted, stop_it=options.stop_on_interrupt, notes=notes)
    except KeyboardInterrupt:  # in the attach check or the pre-flight: before any job request
        created = settle_interrupted_submit(client, SubmitInterrupted(None), stop_it=options.stop_on_interrupt,
                                            notes=notes)
    else:
        attempts.append(job_id)
        return job_id
    if created is not None:
        attempts.append(created)
    return None
