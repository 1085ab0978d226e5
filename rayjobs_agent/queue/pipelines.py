"""Pipelines in the queue: jobs that run after others, kept on the cluster.

A pipeline's jobs enter their queues as any job does, each entry naming its pipeline run and the ids of the jobs it
runs after. Its entries wait unseen until the client's last order seals the run, once every job is entered: then the
run is one key, ``pipeline/RUN``, its jobs by name. So a client that dies half-way leaves no half a pipeline to run:
the entries of a run never sealed end without running once :data:`UNSEALED_KEPT_S` have passed since its newest
entry (a run of hundreds of jobs may take minutes to send).

A job whose every job it runs after has SUCCEEDED (its last attempt, when the keeper retried one lost whole) takes its
place in its queue's order, by priority and submission as any job; until then it is passed over and holds up no one.
When one of them ends FAILED or STOPPED for good, or is gone from Ray's table, the job ends without running, through
the stand-in every job that never runs gets ("not run: prep failed (…)"), and so, in turn, do the jobs after it.

A run sealed with notify settings (the pipeline file's ``notify``) gets one message once every job of it has ended
or was not run: the keeper claims ``notified/RUN`` before it sends, so no restart of it sends twice.

Standard library only, but for Apprise, imported when a message is sent (``rayjobs_agent/notify.py``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping, NamedTuple

from ..notify import END_EVENTS, notify_config, send
from ..queueing import NOT_RUN, awaits_next_attempt, pipeline_run_status
from ..wire import NOTIFY_ENV_VAR, OWN_LINE_PREFIX
from ..wording import format_duration
from .store import KeyValue, ray_job_info

# How long the entries of a pipeline run wait for the order that seals it: the client sends that order right after
# the last entry, so a run still unsealed this long after its first entry lost its client.
UNSEALED_KEPT_S = 600.0

# How long a sealed run shows in the keeper's snapshot (``rayjobs status RUN``), and stays in the store at all.
RUN_SHOWN_S = 7 * 24 * 3600.0
RUN_KEPT_S = 30 * 24 * 3600.0

SUCCEEDED, PENDING, FAILED = "succeeded", "pending", "failed"


def seal(store: KeyValue, run_id: str, jobs: dict[str, str], after: dict[str, list[str]],
         entered: Callable[[str], bool], now: float, *, pipeline: str | None = None,
         notify: str | None = None) -> dict[str, Any]:
    """Seal pipeline run ``run_id`` (job name -> job id; name -> the names it runs after) once every one of its jobs
    is entered (``entered(job_id)``): from then on its jobs line up. The answer to the client's last order.

    ``pipeline``: the pipeline's name; ``notify``: where the run's end is told, as the job's wrapper reads its own
    (the value of ``wire.NOTIFY_ENV_VAR``), kept with the seal and never shown.
    """
    missing = sorted(name for name, job_id in jobs.items() if not entered(job_id))
    if missing:
        return {"error": f"pipeline run {run_id} cannot start: its jobs {', '.join(missing)} are not waiting in their "
                         "queues (never entered, refused, stopped, or withdrawn); nothing of it runs"}
    run: dict[str, Any] = {"jobs": jobs, "after": after, "at": now}
    if pipeline:
        run["pipeline"] = pipeline
    if notify:
        run["notify"] = notify
    if not store.put(f"pipeline/{run_id}", json.dumps(run).encode(), only_if_absent=True):
        return {"exists": run_id}
    return {"sealed": run_id, "jobs": jobs}


def seal_order(store: KeyValue, order: Mapping[str, Any], now: float) -> dict[str, Any]:
    """Carry out a client's order to seal a run (``run``, ``jobs``: name -> id, ``after``: name -> names, and
    optionally ``pipeline``, its name, and ``notify``, as :func:`seal` keeps them), whoever reads it: the keeper, or
    the order's own job when no keeper was alive."""
    jobs = {str(name): str(job) for name, job in (order.get("jobs") or {}).items()}
    after = {str(name): [str(other) for other in before] for name, before in (order.get("after") or {}).items()}
    waiting_ids = {key.rpartition("/")[2] for key in store.keys("waiting/")}
    return seal(store, str(order["run"]), jobs, after, waiting_ids.__contains__, now,
                pipeline=str(order["pipeline"]) if order.get("pipeline") else None, notify=order.get("notify"))


def run_of(store: KeyValue, run_id: str) -> dict[str, Any] | None:
    """What the store keeps of sealed pipeline run ``run_id``: its jobs by name (None: no such run)."""
    raw = store.get(f"pipeline/{run_id}")
    return json.loads(raw) if raw else None


def is_sealed(store: KeyValue, run_id: str | None) -> bool:
    """Whether a job of run ``run_id`` (None: of no pipeline) may line up."""
    return run_id is None or store.get(f"pipeline/{run_id}") is not None


def recent_runs(store: KeyValue, now: float) -> dict[str, Any]:
    """The runs sealed within :data:`RUN_SHOWN_S`, for the keeper's snapshot: each one's jobs and graph (never its
    notify settings, whose URLs hold tokens: the snapshot is a file in the head's log folder)."""
    runs = {}
    for key, raw in store.multi_get(store.keys("pipeline/")).items():
        run = json.loads(raw)
        if now - float(run.get("at") or now) <= RUN_SHOWN_S:
            runs[key.partition("/")[2]] = {field: value for field, value in run.items() if field != "notify"}
    return runs


def forget_old_runs(store: KeyValue, now: float) -> None:
    """Drop runs sealed longer ago than :data:`RUN_KEPT_S`, with what the store says of their jobs that never ran and
    of their notification."""
    for key, raw in store.multi_get(store.keys("pipeline/")).items():
        run = json.loads(raw)
        if now - float(run.get("at") or now) > RUN_KEPT_S:
            for job_id in (run.get("jobs") or {}).values():
                store.delete(f"notrun/{job_id}")
            # The run before its claim: a run left without its claim (a store error, a keeper killed between the
            # two) would be told again, long after its jobs left Ray's table.
            store.delete(key)
            store.delete(f"notified/{key.partition('/')[2]}")


def note_not_run(store: KeyValue, job_id: str, reason: str) -> None:
    """Say that job ``job_id`` ended without running because of the jobs it ran after: the jobs after it say why."""
    store.put(f"notrun/{job_id}", json.dumps({"reason": reason}).encode())


class Standing(NamedTuple):
    """Where one job of a pipeline run stands: ``state`` in the words its client uses too (SUCCEEDED, FAILED,
    STOPPED, ``queueing.NOT_RUN``) or :data:`PENDING` while it may still run; ``job_id``, the attempt it was read
    from (its last, when the keeper submitted it again); ``words``, what happened, to follow a name or that id."""

    state: str
    job_id: str
    words: str


def job_standing(store: KeyValue, job_id: str, waiting_ids: set[str],
                 next_attempt_of: Callable[[str], str | None]) -> Standing:
    """Where job ``job_id`` of a pipeline run stands, followed to its last attempt when it was lost whole and
    submitted again."""
    seen: set[str] = set()
    current = job_id
    while current not in seen:
        seen.add(current)
        if current in waiting_ids or store.get(f"retry/{current}") is not None:
            return Standing(PENDING, current, "waits")
        raw = store.get(f"notrun/{current}")
        if raw:
            return Standing(NOT_RUN, current, f"was not run ({json.loads(raw).get('reason')})")
        info = ray_job_info(store, current)
        if info is None:
            return Standing("FAILED", current, "is gone from Ray's job table")
        status = str(info.get("status") or "")
        if status == "SUCCEEDED":
            return Standing(status, current, "succeeded")
        if status in ("PENDING", "RUNNING"):
            return Standing(PENDING, current, f"is {status}")
        following = next_attempt_of(current)
        if following is not None:
            current = following
            continue
        raw_decision = store.get(f"lost/{current}")
        if awaits_next_attempt(info, json.loads(raw_decision) if raw_decision else None):
            return Standing(PENDING, current, "was lost; the keeper decides whether it runs again")
        # Ray's message for a failed entrypoint is its exit code, then the log's tail: the first line says it.
        first = (str(info.get("message") or "").strip().splitlines() or [""])[0].split(", last available logs")[0]
        said = f": {first[:200]}" if first else ""
        if status == "STOPPED":
            return Standing(status, current, f"was stopped{said}")
        return Standing("FAILED", current, f"failed{said}")
    return Standing("FAILED", job_id, "has attempts that run in a circle")


def dependency_state(store: KeyValue, job_id: str, waiting_ids: set[str],
                     next_attempt_of: Callable[[str], str | None]) -> tuple[str, str]:
    """Where job ``job_id``, which another job runs after, stands: SUCCEEDED, PENDING (waiting, running, or to be
    submitted again) or FAILED for good (failed, stopped, not run or gone), with why in words."""
    standing = job_standing(store, job_id, waiting_ids, next_attempt_of)
    if standing.state == "SUCCEEDED":
        return SUCCEEDED, ""
    return (PENDING if standing.state == PENDING else FAILED), f"{standing.job_id} {standing.words}"


def blocked_by(store: KeyValue, entry: dict[str, Any], waiting_ids: set[str],
               next_attempt_of: Callable[[str], str | None]) -> tuple[str, str]:
    """Whether a waiting job may line up by the jobs it runs after: ("", "") when all SUCCEEDED; (PENDING, why) while
    one of them has yet to; (FAILED, why) when one of them never will."""
    waits = []
    for other in entry.get("after") or []:
        state, why = dependency_state(store, str(other), waiting_ids, next_attempt_of)
        if state == FAILED:
            return FAILED, f"not run: {why}"
        if state == PENDING:
            waits.append(why)
    return (PENDING, "runs after " + "; ".join(waits)) if waits else ("", "")


def runs_to_notify(store: KeyValue) -> dict[str, dict[str, Any]]:
    """The sealed runs with notify settings whose notification nobody has claimed yet (:func:`claim_notification`),
    by run id."""
    keys = store.keys("pipeline/")
    if not keys:
        return {}
    claimed = {key.partition("/")[2] for key in store.keys("notified/")}
    runs = {key.partition("/")[2]: json.loads(raw)
            for key, raw in store.multi_get([key for key in keys if key.partition("/")[2] not in claimed]).items()}
    return {run_id: run for run_id, run in runs.items() if run.get("notify")}


def run_end(store: KeyValue, run: Mapping[str, Any], waiting_ids: set[str],
            next_attempt_of: Callable[[str], str | None]) -> dict[str, Standing] | None:
    """How each job of sealed run ``run`` ended, by name in the graph's order, once every one has ended or was not
    run; None while one may still run."""
    ends = {}
    for name, job_id in (run.get("jobs") or {}).items():
        standing = job_standing(store, str(job_id), waiting_ids, next_attempt_of)
        if standing.state == PENDING:
            return None
        ends[str(name)] = standing
    return ends


def claim_notification(store: KeyValue, run_id: str, now: float) -> bool:
    """Take the sending of run ``run_id``'s notification, once for all keepers: False when one has already.

    Claimed before it is sent: a keeper that dies in between leaves that run's message unsent rather than sent
    twice.
    """
    return store.put(f"notified/{run_id}", json.dumps({"at": now}).encode(), only_if_absent=True)


def run_end_message(run_id: str, run: Mapping[str, Any], ends: Mapping[str, Standing],
                    now: float) -> tuple[str, str, str]:
    """The run's status (``queueing.pipeline_run_status``), and the title and body of the message that tells it:
    the pipeline and run, each job that failed or was stopped with its cause, and the jobs not run."""
    status = pipeline_run_status(standing.state for standing in ends.values())
    pipeline = str(run.get("pipeline") or run_id)
    succeeded = sum(standing.state == "SUCCEEDED" for standing in ends.values())
    took = format_duration(now - float(run.get("at") or now))
    lines = [f"pipeline {pipeline} run {run_id} {status} after {took}: {succeeded} of {len(ends)} jobs succeeded"]
    lines += [f"{name} {standing.words}" for name, standing in ends.items() if standing.state in ("FAILED", "STOPPED")]
    not_run = [name for name, standing in ends.items() if standing.state == NOT_RUN]
    if not_run:
        lines.append(f"{NOT_RUN}: {', '.join(not_run)}")
    lines.append(f"each job: rayjobs status {run_id}")
    return status, f"{OWN_LINE_PREFIX}pipeline {pipeline} {status}", "\n".join(lines)


def notify_run_end(run_id: str, run: Mapping[str, Any], ends: Mapping[str, Standing], now: float, *,
                   sender: Callable[..., list[dict[str, Any]]] = send) -> list[dict[str, Any]]:
    """Tell the run's notify targets that want its end how it ended, within ``notify.SEND_BOUND_S``; one entry per
    target asked, as ``notify.send`` gives them.

    Never raises for a target that fails (``notify.send`` says so once in the keeper's log); settings that cannot be
    read are said once and send nothing.
    """
    settings = str(run.get("notify") or "")
    config = notify_config({NOTIFY_ENV_VAR: settings})
    if config is None:
        return []
    status, title, body = run_end_message(run_id, run, ends, now)
    # Masked as a job's own message is: by the keeper's secrets and the targets' tokens alike.
    return sender(config, END_EVENTS[status], title, body, environ={**os.environ, NOTIFY_ENV_VAR: settings})


__all__ = ["FAILED", "PENDING", "SUCCEEDED", "UNSEALED_KEPT_S", "Standing", "blocked_by", "claim_notification",
           "dependency_state", "is_sealed", "forget_old_runs", "job_standing", "note_not_run", "notify_run_end",
           "recent_runs", "run_end", "run_end_message", "run_of", "runs_to_notify", "seal", "seal_order"]
