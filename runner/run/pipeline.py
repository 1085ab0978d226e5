"""A pipeline's run on this side: its jobs sent to the cluster's queue as one run, and followed as one.

Every job is entered into its queue (its spec's, or a queue named after the pipeline) with the ids of the jobs it runs
after and the run folders they will keep, and nothing lines up until the last order seals the run: a client that
dies half-way leaves nothing to run. From then on the run is the cluster's (``rayjobs_agent/queue/pipelines.py``):
the client may go away, and following it only reads what the keeper and Ray's job table say.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from jobs.notify import job_notify_settings
from jobs.pipeline import job_id as pipeline_job_id
from jobs.queueing import queue_grows, queue_needs
from jobs.submission import build_submission, link_record, run_folder
from rayjobs_agent.package import agent_modules_sent
from rayjobs_agent.queueing import NOT_RUN, awaits_next_attempt, pipeline_job_ended, pipeline_run_status
from rayjobs_agent.record_layout import PIPELINE_FIELD
from rayjobs_agent.wire import (AFTER_ENV_VAR, METADATA_ATTEMPT, METADATA_PARENT, METADATA_PIPELINE,
                                RUN_PER_SUBMISSION_ENV_VAR, after_variable, ray_env_json)
from runner.client.queue import ClusterQueue
from runner.client.submission import working_dir_size
from runner.errors import ExitCode, RayJobsError, exit_code_for_status
from runner.run.code_upload import code_destination, upload_code
from runner.run.preflight import check_queue_fits

if TYPE_CHECKING:
    from jobs.pipeline import LoadedPipeline
    from runner.client.jobs_api import JobsApi

POLL_S = 2.0


class PipelineNotStarted(RayJobsError):
    """The keeper refused to seal the run: one of its jobs was never entered (nothing of it runs)."""

    exit_code = ExitCode.FAILED


@dataclass
class SubmittedPipeline:
    """A pipeline run sent to the cluster: its id, and each job's id and the names it runs after."""

    run_id: str
    jobs: dict[str, str]
    after: dict[str, list[str]] = field(default_factory=dict)


def submit_pipeline(client: JobsApi, loaded: LoadedPipeline, say: Callable[[str], None]) -> SubmittedPipeline:
    """Enter every job of ``loaded`` into its queue as one new run, then seal the run; what was submitted.

    Raises:
        PipelineNotStarted: the keeper found a job of the run missing (nothing of it runs).
        RayJobsError: the cluster could not be reached, or refused a request.
    """
    run_id = f"{loaded.name}-{secrets.token_hex(4)}"
    ids = {name: pipeline_job_id(run_id, name) for name in loaded.order}  # in the graph's order, as shown
    folders = {name: run_folder(spec, ids[name], per_submission=True) for name, spec in loaded.jobs.items()}
    queue = ClusterQueue(client)
    for name in loaded.order:  # every job is checked before any is sent: nothing of a run that cannot start goes out
        check_queue_fits(client, queue_needs(loaded.jobs[name]), loaded.jobs[name].spec.queue or loaded.name,
                         warn=lambda text: say(f"warning: {text}"))
    for name in loaded.order:
        spec = loaded.jobs[name]
        submission = build_submission(spec)
        submission["submission_id"] = ids[name]
        submission.setdefault("metadata", {})[METADATA_PIPELINE] = run_id
        env_vars = submission.setdefault("runtime_env", {}).setdefault("env_vars", {})
        # Each run of the pipeline is a run of its own: its jobs' run folders are named after their ids.
        env_vars[RUN_PER_SUBMISSION_ENV_VAR] = "1"
        before = loaded.after[name]
        # Its record names the run and the jobs before it, so that the records alone draw the pipeline's graph.
        link_record(submission, {PIPELINE_FIELD: {"run": run_id, "job": name,
                                                  "after": {other: folders[other] for other in before}}})
        if before:
            env_vars[AFTER_ENV_VAR] = ray_env_json({other: folders[other] for other in before})
            env_vars.update({after_variable(other): folders[other] for other in before})
        local_modules = list(submission["runtime_env"].get("py_modules") or [])
        destination = code_destination(spec, submission, working_dir_size)
        if destination is not None:
            submission = upload_code(submission, destination, say)
        request = client.prepare(submission, warn=lambda text: say(f"warning: {text}"), progress=say)
        sent_modules = (request.get("runtime_env") or {}).get("py_modules") or []
        agent_modules = agent_modules_sent(local_modules, sent_modules)
        answer = queue.enqueue(request, queue=spec.spec.queue or loaded.name, priority=spec.spec.priority,
                               needs=queue_needs(spec), name=spec.spec.name, agent_modules=agent_modules, wait=False,
                               grows=queue_grows(spec),
                               pipeline={"run": run_id, "job": name, "after": [ids[other] for other in before]})
        if "exists" in answer:  # ids carry a fresh random part: only a run submitted twice at once could meet one
            raise PipelineNotStarted(f"job id {ids[name]} is taken already; submit the pipeline again")
    # A pipeline run has no attempts of its own: its jobs retry, each by its own spec.
    notify = job_notify_settings(loaded.notify, attempts=1) if loaded.notify else None
    sealed = queue.seal(run_id, ids, loaded.after, pipeline=loaded.name, notify=notify)
    if "error" in sealed:
        raise PipelineNotStarted(f"pipeline {loaded.name} did not start: {sealed['error']}")
    say(f"submitted pipeline {loaded.name} as {run_id}: {len(ids)} jobs ({', '.join(loaded.order)}) to "
        f"{client.address}")
    return SubmittedPipeline(run_id, ids, dict(loaded.after))


def job_states(client: JobsApi, submitted: SubmittedPipeline) -> dict[str, str]:
    """Each job's state in words, as the keeper and Ray's job table say it now: ``waiting (why)``, ``RUNNING``,
    ``SUCCEEDED``, ``not run (why)``, …"""
    snapshot = ClusterQueue(client).snapshot() or {}
    waiting = {job["id"]: job for queue in snapshot.get("queues") or [] for job in queue.get("waiting") or []}
    decisions = snapshot.get("retries") or {}
    in_ray = {job.get("submission_id"): job for job in client.list_jobs()}
    states = {}
    for name, job_id in submitted.jobs.items():
        current = _last_attempt(job_id, in_ray)
        waits = next((waiting[found] for found in (job_id, (current or {}).get("submission_id")) if found in waiting),
                     None)
        if waits is not None:
            states[name] = f"waiting ({waits.get('reason') or 'position ' + str(waits.get('position'))})"
        elif current is None:
            states[name] = "being entered"
        elif awaits_next_attempt(current, decisions.get(current["submission_id"])):
            states[name] = "lost; the keeper runs it again"
        else:
            status = str(current.get("status"))
            not_run = _not_run_reason(current)
            states[name] = f"{NOT_RUN} ({not_run})" if not_run else status
    return states


def run_exit_code(states: dict[str, str]) -> ExitCode:
    """A pipeline run's exit code from its jobs' states (in the graph's order): 0 when every job SUCCEEDED, else that
    of the first one that did not (3 stopped; 1 failed or not run); 0 while none has failed yet
    (``queueing.pipeline_run_status``, which the keeper's notification reads too)."""
    return exit_code_for_status(pipeline_run_status(states.values()))


def follow_pipeline(client: JobsApi, submitted: SubmittedPipeline, say: Callable[[str], None], *,
                    poll_s: float = POLL_S, sleep: Callable[[float], None] = time.sleep) -> ExitCode:
    """Say each job's state whenever it changes until every job has ended; the pipeline's exit code
    (:func:`run_exit_code`)."""
    said: dict[str, str] = {}
    while True:
        states = job_states(client, submitted)
        for name in submitted.jobs:
            if states[name] != said.get(name):
                say(f"{submitted.run_id}: {name} {states[name]}")
        said = states
        if all(pipeline_job_ended(state) for state in states.values()):
            break
        sleep(poll_s)
    return run_exit_code(states)


def _last_attempt(job_id: str, in_ray: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The job's record in Ray's table, or that of its last attempt when the keeper submitted one after a loss (an
    attempt names its first in its metadata, whatever its id)."""
    attempts = [job for job in in_ray.values() if (job.get("metadata") or {}).get(METADATA_PARENT) == job_id]
    if not attempts:
        return in_ray.get(job_id)
    return max(attempts, key=lambda job: int((job.get("metadata") or {}).get(METADATA_ATTEMPT) or 0))


def _not_run_reason(job: dict[str, Any]) -> str | None:
    """Why a job ended without running, when its stand-in says it did for a job it ran after."""
    from rayjobs_agent.queueing import Admission

    try:
        admission = Admission.from_environment(((job.get("runtime_env") or {}).get("env_vars")) or {})
    except (ValueError, TypeError, KeyError):
        return None
    if admission is None or not admission.outcome or not admission.reason.startswith("not run: "):
        return None
    return admission.reason.removeprefix("not run: ")


__all__ = ["PipelineNotStarted", "SubmittedPipeline", "follow_pipeline", "job_states", "run_exit_code",
           "submit_pipeline"]
