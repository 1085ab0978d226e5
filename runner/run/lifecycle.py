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

from jobs.infra.status import JobStatus
from rayjobs_agent.wire import METADATA_ATTEMPT
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
from runner.follow.watching import FollowedJob
from runner.client.jobs_api import wait_until_ended
from runner.run.interrupts import detach_or_stop, settle_interrupted_submit
from runner.reporter import Reporter
from runner.run.preflight import entrypoint_demand
from jobs.retry import retry_policy
from rayjobs_agent.retries import retries_whole_jobs
from runner.run import retry_policy as retry_waits
from runner.run.retry_policy import decide_resubmit
from runner.run.stall import StallRule
from runner.run.submit import submit_or_attach, submit_settling_interrupts

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec
    from runner.client.jobs_api import JobsApi

# The steps a caller may want on their own, named here so one import reaches the whole run.
__all__ = ["RunOptions", "RunOutcome", "RunResult", "detach_or_stop", "follow_job", "next_attempt", "run_with_retries",
           "settle_interrupted_submit", "submit_or_attach", "wait_until_ended"]

LOG_TAIL_LINES = 10
# How long a follower waits for the keeper's decision about a job lost whole, and how often it looks.
NEXT_ATTEMPT_WAIT_S = 120.0
NEXT_ATTEMPT_POLL_S = 1.0


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
    """Submit (or attach), follow to the end, and follow the next attempts of a job retried by the spec's policy.

    A failed entrypoint is retried by the agent beside it, in the same job (``rayjobs_agent/retries.py``);
    those attempts are followed here as they run. A job lost whole (its supervisor died, it never started,
    its node went with the head) is submitted again by the cluster's queue keeper, by the same rule and
    whether anybody follows it or not, with metadata ``rayjobs.attempt`` (its number) and ``rayjobs.parent``
    (the first attempt's id), as ``<first id>-attemptN``: it is followed here as it comes.

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
                                        loaded=loaded, queue=queue, await_place=options.wait)
    if job_id is None:
        return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts)
    if queue is None and retries_whole_jobs(retry_policy(spec)):
        # The keeper submits the job again if it is lost whole, followed or not: the cluster must have one.
        ensure_keeper(client, Reporter(notes).say)
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
        if result.exit_code != ExitCode.FAILED or not decide_resubmit(spec, info, tries).retry:
            return result
        try:
            next_id = next_attempt(client, job_id, Reporter(notes).say)
        except KeyboardInterrupt:
            detach_or_stop(client, job_id, stop_it=options.stop_on_interrupt, notes=notes)
            return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, attempts, progress=result.progress)
        if next_id is None:
            return result
        attempts.append(next_id)
        job_id = next_id


def ensure_keeper(client: JobsApi, say: Any) -> None:
    """Make sure the cluster has a queue keeper, which submits a job lost whole again; a cluster that cannot take the
    order is said once, and the job runs on (it is then retried in place only)."""
    from runner.client.queue import ClusterQueue
    from runner.errors import RayJobsError

    try:
        ClusterQueue(client).ensure_keeper()
    except RayJobsError as exc:
        say(f"note: the cluster's queue keeper could not be started ({exc}); a job lost whole is not submitted again")


def next_attempt(client: JobsApi, job_id: str, say: Any, *, within_s: float = NEXT_ATTEMPT_WAIT_S,
                 poll_s: float = NEXT_ATTEMPT_POLL_S) -> str | None:
    """The id of the attempt the cluster's keeper submits after job ``job_id`` was lost whole (said as it is known),
    once it is in Ray's table or its queue; None when the keeper retries nothing more (said why).

    Raises:
        KeyboardInterrupt: Ctrl-C; the keeper goes on either way.
    """
    from runner.client.queue import ClusterQueue

    queue = ClusterQueue(client)
    deadline = retry_waits.now() + within_s
    decided = None
    while retry_waits.now() < deadline:
        decided = queue.decision_about(job_id)
        if decided is not None:
            break
        retry_waits.sleep(poll_s)
    if decided is None:
        say(f"no attempt followed job {job_id}: the cluster's queue keeper decided nothing within {within_s:g}s "
            "(`rayjobs queue` shows whether the cluster has one)")
        return None
    if decided.get("note"):
        say(decided["note"])
    if not decided.get("retry") or not decided.get("next"):
        return None
    next_id = str(decided["next"])
    deadline = max(deadline, retry_waits.now() + float(decided.get("due", 0)) - float(decided.get("at", 0)) + within_s)
    while retry_waits.now() < deadline:
        try:
            job_or_place(client, next_id)
            return next_id
        except JobNotFound:
            retry_waits.sleep(poll_s)
    say(f"attempt {decided.get('attempt')} ({next_id}) did not reach the cluster in time; "
        f"`rayjobs status {next_id}` shows it once it does")
    return None


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
            wait_for_turn(client, job_id, Reporter(notes).say, just_queued=just_queued,
                          give_up_after_s=options.give_up_after_s)
        except KeyboardInterrupt:
            detach_or_stop(client, job_id, stop_it=options.stop_on_interrupt, notes=notes)
            return RunResult(ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED, [job_id])
    watch = FollowedJob(client, job_id, logs_out or sys.stdout, notes or sys.stderr, raw=options.raw, live=options.live,
                  stream_logs=options.stream_logs, stall_after_s=stall_after_s)
    stall = StallRule(client, job_id, watch)
    notes, progress = watch.notes, watch.progress
    out = Reporter(notes)
    follower = Follower(client, job_id, logs_out=watch.view, notes=notes, stream_logs=options.stream_logs,
                        give_up_after_s=options.give_up_after_s, timeout_s=timeout_s, start_timeout_s=start_timeout_s,
                        demand=demand, new_stall=watch.new_stall if options.stream_logs else None,
                        on_stall=stall.on_stall, on_info=watch.job_info)
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
