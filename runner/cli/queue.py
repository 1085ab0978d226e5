"""``rayjobs queue``: a cluster's queues, and their limits (``rayjobs queue set NAME --max-running N``).

A queue's state lives in the cluster's key-value store, which most clusters do not expose outside
themselves; the commands read and write it through a small job that runs ``rayjobs_observe.queueing``
on the cluster (a few seconds), so they work wherever a job can be submitted.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from runner.cli.options import (ConnectionOptions, OutputOption, check_output, handles_errors,
                                with_connection_options)
from runner.errors import BadInput, ClusterRequestFailed

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi

# What the small job prints its answer after, on one line of its log.
ANSWER_MARKER = "rayjobs-queue "
QUEUE_JOB_WAIT_S = 120.0


@handles_errors
@with_connection_options
def queue(
    words: Annotated[Optional[list[str]], typer.Argument(metavar="[NAME] | set NAME", help="A queue to list "
                     "(default: every queue), or `set NAME` with --max-running N or --no-limit.",
                     show_default=False)] = None,
    max_running: Annotated[Optional[int], typer.Option("--max-running", min=1, metavar="N", help="With set: how "
                           "many of the queue's jobs run at once.", show_default=False)] = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="With set: remove the limit (its jobs then wait "
                        "only for the cluster to have free what they need).")] = False,
    connection: ConnectionOptions = ConnectionOptions(),
    output: OutputOption = "text",
) -> None:
    """List the cluster's queues (running jobs, then waiting ones in the order they go), or set a queue's limit.

    `rayjobs queue`, `rayjobs queue team-a`, `rayjobs queue set team-a --max-running 2`. Limits live on the
    cluster, so every spec of a queue finds the same one.
    """
    check_output(output)
    words = list(words or [])
    if words[:1] == ["set"]:
        if len(words) != 2 or (max_running is None) == (not no_limit):
            raise BadInput("usage: rayjobs queue set NAME --max-running N (or --no-limit)")
        arguments = ["set", words[1], "none" if no_limit else str(max_running)]
    else:
        if len(words) > 1 or max_running is not None or no_limit:
            raise BadInput("usage: rayjobs queue [NAME]; to change a limit: rayjobs queue set NAME --max-running N")
        arguments = ["show"] + words
    queues = run_queue_command(connection, arguments)
    typer.echo(json.dumps(queues, indent=2) if output == "json" else queues_text(queues))


def run_queue_command(connection: ConnectionOptions, arguments: list[str]) -> list[dict[str, Any]]:
    """Run ``python -m rayjobs_observe.queueing ARGUMENTS`` as a small job and return what it printed.

    Raises:
        ClusterRequestFailed: the job failed or printed no answer (its log's end is in the message).
    """
    from jobs.submission import OBSERVE_PACKAGE_DIR
    from runner.client.jobs_api import JobsApi
    from runner.run.interrupts import wait_until_ended

    client = JobsApi(connection.resolve(), retry_for_s=5.0)
    submission = {"entrypoint": "python -m rayjobs_observe.queueing " + " ".join(arguments),
                  "runtime_env": {"py_modules": [str(OBSERVE_PACKAGE_DIR)]},
                  "metadata": {"rayjobs.name": "rayjobs-queue"}}
    job_id = client.submit(submission)
    status, ended = wait_until_ended(client, job_id, within_s=QUEUE_JOB_WAIT_S)
    log = client.job_log(job_id) if ended else ""
    answer = next((line[len(ANSWER_MARKER):] for line in reversed(log.splitlines())
                   if line.startswith(ANSWER_MARKER)), None)
    if ended:
        _forget(client, job_id)
    if answer is None:
        tail = "\n".join(log.splitlines()[-5:])
        raise ClusterRequestFailed(f"the queue could not be read: job {job_id} ended {status or 'not in time'}"
                                   + (f"; its log ends:\n{tail}" if tail else ""))
    return json.loads(answer)


def _forget(client: JobsApi, job_id: str) -> None:
    """Delete the small job, so that `rayjobs list` shows the team's jobs only (a failure here is harmless)."""
    from runner.errors import RayJobsError

    try:
        client.delete_finished_job(job_id, client.get_job(job_id).get("end_time"))
    except RayJobsError:
        pass


def queues_text(queues: list[dict[str, Any]]) -> str:
    """The queues as a person reads them: one line per queue, then one per job running or waiting."""
    if not queues:
        return "no queues on this cluster (a spec joins one with `queue: NAME`)"
    lines = []
    for queue in queues:
        limit = queue.get("max_running")
        running, waiting = queue.get("running") or [], queue.get("waiting") or []
        lines.append(f"queue {queue['queue']}: {len(running)} of {limit if limit is not None else 'unlimited'} "
                     f"running, {len(waiting)} waiting")
        lines += [f"  running  {job['id']}  needs {_needs(job.get('needs'))}" for job in running]
        lines += [f"  waiting  {job['position']}. {job['id']}  priority {job.get('priority', 0)}  "
                  f"needs {_needs(job.get('needs'))}" for job in waiting]
    return "\n".join(lines)


def queue_state_from_log(text: str) -> dict[str, Any] | None:
    """The last queue event in a job's log (``{"state": "waiting", "position", "reason"}`` or ``admitted``)."""
    from jobs.run_vocabulary import EVENT_MARKER, EventKind, kind_of
    from runner.follow.progress import parse_event

    for line in reversed(text.splitlines()):
        event = parse_event(line) if EVENT_MARKER in line else None
        if event is not None and kind_of(event) == EventKind.QUEUE:
            return event
    return None


def _needs(needs: dict[str, float] | None) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in sorted((needs or {}).items())) or "nothing declared"


def waiting_in_queue(info: dict[str, Any], log_text: str) -> dict[str, Any] | None:
    """The queue event of a running job that still waits in its queue (None once it has started, or if in none)."""
    if info.get("status") != "RUNNING" or "rayjobs.queue" not in (info.get("metadata") or {}):
        return None
    state = queue_state_from_log(log_text)
    return state if state is not None and state.get("state") == "waiting" else None


def queued_text(state: dict[str, Any]) -> str:
    """One line for a job waiting in its queue: ``QUEUED: position 2 in queue team-a (2 of 2 running …)``."""
    return f"QUEUED: position {state.get('position')} in queue {state.get('queue')} ({state.get('reason')})"


# A waiting job's log is short: its wrapper has said little more than its place.
_QUEUE_LOG_LINES = 200


def with_queue_place(client: JobsApi, info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with ``queue`` (its queue event) added when the job still waits in its queue; one log read per such job."""
    from runner.errors import RayJobsError

    if info.get("status") != "RUNNING" or "rayjobs.queue" not in (info.get("metadata") or {}):
        return info
    try:
        text = client.job_log(info.get("submission_id") or "", _QUEUE_LOG_LINES,
                              driver_node_id=info.get("driver_node_id"))
    except RayJobsError:
        return info
    state = waiting_in_queue(info, text)
    return {**info, "queue": state} if state else info
