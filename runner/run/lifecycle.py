"""Running a spec's job to its end: submit (or attach), follow, and retry per the spec's policy.

The ``rayjobs submit`` command is a thin layer over these functions; a notebook, an Airflow
task or a test calls them the same way. They take the cluster client (``runner.client.jobs_api.JobsApi``,
or anything with its methods) and two text streams: ``logs_out`` for the job's log and
``notes`` for rayjobs' own ``rayjobs: …`` lines. Outcomes come back as a ``RunResult``; only
a problem nobody can fix by waiting (a bad spec, refused credentials) is raised.

The steps of a run have modules of their own in this package (``submit.py``, ``interrupts.py``,
``retry_policy.py``, ``stall.py``); the ones callers use are importable from here too, under the
same names, and ``runner`` itself exports the Python API by name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, TextIO

from jobs.infra.status import JobStatus, is_terminal
from rayjobs_agent.wire import METADATA_ATTEMPT, METADATA_PARENT
from rayjobs_agent.vocabulary import decode
from jobs.queueing import queue_config
from jobs.submission import build_submission
from runner.errors import ExitCode, JobNotFound
from rayjobs_agent.causes import Diagnosis
from runner.follow.follower import DEFAULT_GIVE_UP_S, Follower, Outcome
from runner.follow.log_view import ANSI_ESCAPE, diagnosis_of
from runner.follow.messages import summary_line
from runner.follow.progress import RunProgress
from runner.follow.queued import job_or_place, wait_for_turn
from runner.follow.watching import Watch
from runner.client.jobs_api import wait_until_ended
from runner.run.interrupts import detach_or_stop, settle_interrupted_submit
from runner.reporter import Reporter
from runner.run.preflight import entrypoint_demand
from runner.run.retry_policy import decide_resubmit, wait_before_retry
from runner.run.stall import StallRule
from runner.run.submit import submit_or_attach, submit_settling_interrupts

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec
    from runner.client.jobs_api import JobsApi

# The steps a caller may want on their own, named here so one import reaches the whole run.
__all__ = ["RunOptions", "RunOutcome", "RunResult", "detach_or_stop", "follow_job", "run_with_retries",
           "settle_interrupted_submit", "submit_or_attach", "wait_until_ended"]

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
    # Why the last attempt failed: the agent's cause event (rayjobs_agent.causes), or the same table read here for a
    # job that ran without the agent.
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


def run_with_retries(client: JobsApi, loaded: LoadedSpec, *, options: RunOptions | None = None,
                     notes: TextIO | None = None, logs_out: TextIO | None = None) -> RunResult:
    """Submit (or attach), follow to the end, and submit again when the job was lost whole and the spec says so.

    A failed entrypoint is retried by the agent beside it, in the same job (``rayjobs_agent/retries.py``);
    those attempts are followed here as they run. A job lost whole (its supervisor died, it never started)
    is submitted again, with metadata ``rayjobs.attempt`` (its number) and ``rayjobs.parent`` (the first
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
    queue = queue_config(loaded)
    job_id = submit_settling_interrupts(client, submission, spec.name, preflight=options.preflight,
                                        stop_on_interrupt=options.stop_on_interrupt, notes=notes, attempts=attempts,
                                        loaded=loaded, queue=queue)
    if job_id is None:
        return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts)
    if not options.wait:
        if spec.timeout_s or spec.start_timeout_s:
            Reporter(notes).say("note: timeout_s and start_timeout_s are applied only while rayjobs follows the job "
                             "(max_retries is applied on the cluster, followed or not)")
        return RunResult(ExitCode.SUCCEEDED, RunOutcome.SUBMITTED, attempts)
    tries = 0  # attempts run so far: each job submitted, and each time the agent ran one again in place
    while True:
        result = follow_job(client, job_id, options=options, timeout_s=spec.timeout_s,
                            start_timeout_s=spec.start_timeout_s, demand=entrypoint_demand(submission),
                            stall_after_s=spec.stall_after_s,
                            notes=notes, logs_out=logs_out, queued=queue is not None,
                            just_queued=queue is not None)
        result.attempts = attempts
        tries += 1 + len(result.progress.retries)
        info = result.info or {}
        if result.exit_code != ExitCode.FAILED:
            return result
        decision = decide_resubmit(spec, info, tries)
        if decision.note:
            Reporter(notes).say(decision.note)
        if not decision.retry:
            return result
        if not wait_before_retry(decision.delay_s):
            Reporter(notes).say(f"interrupted while waiting to retry: no attempt {tries + 1} was submitted")
            return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts, progress=result.progress)
        attempt = tries + 1
        retry = dict(submission, metadata={**metadata, METADATA_ATTEMPT: str(attempt), METADATA_PARENT: attempts[0]})
        if spec.submission_id:
            retry["submission_id"] = attempt_id(client, spec.submission_id, attempt)
        job_id = submit_settling_interrupts(client, retry, spec.name, preflight=False,
                                            stop_on_interrupt=options.stop_on_interrupt, notes=notes,
                                            attempts=attempts, queue=queue)
        if job_id is None:
            return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts)


def attempt_id(client: JobsApi, first: str, attempt: int) -> str:
    """The id of retry ``attempt`` of the run whose first attempt is ``first``: ``FIRST-attemptN``.

    An attempt of that id that has already ended belongs to an earlier invocation of the same spec (one that
    was retried before): attaching to it would run nothing, so the next free ``FIRST-attemptN-K`` is taken. One
    still running or waiting is this run's own, started by a submitter beside this one, and is attached to.
    """
    candidate, again = f"{first}-attempt{attempt}", 1
    while True:
        try:
            info = job_or_place(client, candidate)
        except JobNotFound:
            return candidate
        if not is_terminal(info.get("status")):
            return candidate
        again += 1
        candidate = f"{first}-attempt{attempt}-{again}"


def follow_job(client: JobsApi, job_id: str, *, options: RunOptions | None = None, timeout_s: float | None = None,
               start_timeout_s: float | None = None, demand: dict[str, float] | None = None,
               stall_after_s: float | None = None,
               log_tail_on_failure: bool = True, notes: TextIO | None = None,
               logs_out: TextIO | None = None, queued: bool = False, just_queued: bool = False) -> RunResult:
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
        queued: the job may wait in its cluster queue: it is followed from when the queue lets it in, its place
            said meanwhile.
        just_queued: the job was just entered into its cluster queue (it may not show there for a moment).

    Returns:
        The result, with ``attempts == [job_id]``.

    Raises:
        JobNotFound, AuthFailed: on the first status call.
    """
    options = options or RunOptions()
    if queued:
        try:
            wait_for_turn(client, job_id, Reporter(notes).say, just_queued=just_queued)
        except KeyboardInterrupt:
            detach_or_stop(client, job_id, stop_it=options.stop_on_interrupt, notes=notes)
            return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, [job_id])
    watch = Watch(client, job_id, logs_out or sys.stdout, notes or sys.stderr, raw=options.raw, live=options.live,
                  stream_logs=options.stream_logs)
    stall = StallRule(client, job_id, watch, stall_after_s)
    notes, progress = watch.notes, watch.progress
    out = Reporter(notes)
    follower = Follower(client, job_id, logs_out=watch.view, notes=notes, stream_logs=options.stream_logs,
                        give_up_after_s=options.give_up_after_s, timeout_s=timeout_s, start_timeout_s=start_timeout_s,
                        demand=demand, stall_after=stall.after if options.stream_logs else None,
                        on_stall=stall.on_stall, activity=watch.last_activity, on_quiet=watch.on_quiet,
                        on_info=watch.job_info, agent_stall=watch.new_stall, beside_agent=lambda: watch.beside_agent)
    try:
        followed = follower.run()
    except KeyboardInterrupt:
        watch.close()
        detach_or_stop(client, job_id, stop_it=options.stop_on_interrupt, notes=notes)
        return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, [job_id], progress=progress)
    watch.close()
    summary = summary_line(job_id, followed.exit_code, followed.info, followed.reason, watch.waiting_text())
    diagnosis = None
    if followed.status == JobStatus.FAILED:
        # What is printed never changes what is done: a job followed without its log (--quiet) is diagnosed from
        # the log as well, so that it is retried (or not) as a followed one would be.
        diagnosis = (diagnosis_of(progress, watch.failure) if options.stream_logs
                     else _diagnosis_from_log(client, job_id, followed.info or {}))
    if options.summaries:
        out.say(summary)
        if diagnosis is not None:
            out.say(f"why: {diagnosis.paragraph()}")
        if log_tail_on_failure and followed.status == JobStatus.FAILED and followed.log_tail:
            out.say("last lines of its log:")
            # The event lines are for rayjobs to read (the cause above is one of them, said in words).
            plain = [ANSI_ESCAPE.sub("", line) for line in followed.log_tail]
            for line in [line for line in plain if decode(line) is None][-LOG_TAIL_LINES:]:
                out.write(f"  | {line}")
    return RunResult(followed.exit_code, _OUTCOME_OF_CODE[followed.exit_code], [job_id], followed, summary,
                     progress, diagnosis)


# How much of a job's log a diagnosis reads when the log was not followed (the same as `rayjobs status`).
_DIAGNOSIS_LOG_LINES = 5000


def _diagnosis_from_log(client: JobsApi, job_id: str, info: dict[str, Any]) -> Diagnosis | None:
    """Why a job failed, read from the end of its log (fetched now; None when it cannot be read)."""
    from runner.errors import RayJobsError
    from runner.follow.log_view import diagnosis_of, read_job_log

    try:
        text = client.job_log(job_id, _DIAGNOSIS_LOG_LINES, driver_node_id=info.get("driver_node_id"))
    except RayJobsError:
        return None
    return diagnosis_of(*read_job_log(info, text))
