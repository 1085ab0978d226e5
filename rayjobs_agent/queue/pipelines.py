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

Standard library only.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from ..queueing import awaits_next_attempt
from .store import KeyValue, ray_job_info

# How long the entries of a pipeline run wait for the order that seals it: the client sends that order right after
# the last entry, so a run still unsealed this long after its first entry lost its client.
UNSEALED_KEPT_S = 600.0

# How long a sealed run shows in the keeper's snapshot (``rayjobs status RUN``), and stays in the store at all.
RUN_SHOWN_S = 7 * 24 * 3600.0
RUN_KEPT_S = 30 * 24 * 3600.0

SUCCEEDED, PENDING, FAILED = "succeeded", "pending", "failed"


def seal(store: KeyValue, run_id: str, jobs: dict[str, str], after: dict[str, list[str]],
         entered: Callable[[str], bool], now: float) -> dict[str, Any]:
    """Seal pipeline run ``run_id`` (job name -> job id; name -> the names it runs after) once every one of its jobs
    is entered (``entered(job_id)``): from then on its jobs line up. The answer to the client's last order."""
    missing = sorted(name for name, job_id in jobs.items() if not entered(job_id))
    if missing:
        return {"error": f"pipeline run {run_id} cannot start: its jobs {', '.join(missing)} are not waiting in their "
                         "queues (never entered, refused, stopped, or withdrawn); nothing of it runs"}
    run = {"jobs": jobs, "after": after, "at": now}
    if not store.put(f"pipeline/{run_id}", json.dumps(run).encode(), only_if_absent=True):
        return {"exists": run_id}
    return {"sealed": run_id, "jobs": jobs}


def seal_order(store: KeyValue, order: Mapping[str, Any], now: float) -> dict[str, Any]:
    """Carry out a client's order to seal a run (``run``, ``jobs``: name -> id, ``after``: name -> names), whoever
    reads it: the keeper, or the order's own job when no keeper was alive."""
    jobs = {str(name): str(job) for name, job in (order.get("jobs") or {}).items()}
    after = {str(name): [str(other) for other in before] for name, before in (order.get("after") or {}).items()}
    waiting_ids = {key.rpartition("/")[2] for key in store.keys("waiting/")}
    return seal(store, str(order["run"]), jobs, after, waiting_ids.__contains__, now)


def run_of(store: KeyValue, run_id: str) -> dict[str, Any] | None:
    """What the store keeps of sealed pipeline run ``run_id``: its jobs by name (None: no such run)."""
    raw = store.get(f"pipeline/{run_id}")
    return json.loads(raw) if raw else None


def is_sealed(store: KeyValue, run_id: str | None) -> bool:
    """Whether a job of run ``run_id`` (None: of no pipeline) may line up."""
    return run_id is None or store.get(f"pipeline/{run_id}") is not None


def recent_runs(store: KeyValue, now: float) -> dict[str, Any]:
    """The runs sealed within :data:`RUN_SHOWN_S`, for the keeper's snapshot: each one's jobs and graph."""
    runs = {}
    for key, raw in store.multi_get(store.keys("pipeline/")).items():
        run = json.loads(raw)
        if now - float(run.get("at") or now) <= RUN_SHOWN_S:
            runs[key.partition("/")[2]] = run
    return runs


def forget_old_runs(store: KeyValue, now: float) -> None:
    """Drop runs sealed longer ago than :data:`RUN_KEPT_S`, with what the store says of their jobs that never ran."""
    for key, raw in store.multi_get(store.keys("pipeline/")).items():
        run = json.loads(raw)
        if now - float(run.get("at") or now) > RUN_KEPT_S:
            for job_id in (run.get("jobs") or {}).values():
                store.delete(f"notrun/{job_id}")
            store.delete(key)


def note_not_run(store: KeyValue, job_id: str, reason: str) -> None:
    """Say that job ``job_id`` ended without running because of the jobs it ran after: the jobs after it say why."""
    store.put(f"notrun/{job_id}", json.dumps({"reason": reason}).encode())


def dependency_state(store: KeyValue, job_id: str, waiting_ids: set[str],
                     next_attempt_of: Callable[[str], str | None]) -> tuple[str, str]:
    """Where job ``job_id``, which another job runs after, stands: SUCCEEDED, PENDING (waiting, running, or to be
    submitted again) or FAILED for good, with why in words.

    A job lost whole and submitted again is followed to its last attempt.
    """
    seen: set[str] = set()
    current = job_id
    while current not in seen:
        seen.add(current)
        if current in waiting_ids or store.get(f"retry/{current}") is not None:
            return PENDING, f"{current} waits"
        raw = store.get(f"notrun/{current}")
        if raw:
            return FAILED, f"{current} was not run ({json.loads(raw).get('reason')})"
        info = ray_job_info(store, current)
        if info is None:
            return FAILED, f"{current} is gone from Ray's job table"
        status = str(info.get("status") or "")
        if status == "SUCCEEDED":
            return SUCCEEDED, ""
        if status in ("PENDING", "RUNNING"):
            return PENDING, f"{current} is {status}"
        following = next_attempt_of(current)
        if following is not None:
            current = following
            continue
        raw_decision = store.get(f"lost/{current}")
        if awaits_next_attempt(info, json.loads(raw_decision) if raw_decision else None):
            return PENDING, f"{current} was lost; the keeper decides whether it runs again"
        # Ray's message for a failed entrypoint is its exit code, then the log's tail: the first line says it.
        first = (str(info.get("message") or "").strip().splitlines() or [""])[0].split(", last available logs")[0]
        said = f": {first[:200]}" if first else ""
        return FAILED, f"{current} {'was stopped' if status == 'STOPPED' else 'failed'}{said}"
    return FAILED, f"{job_id}'s attempts run in a circle"


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


__all__ = ["FAILED", "PENDING", "SUCCEEDED", "UNSEALED_KEPT_S", "blocked_by", "dependency_state", "is_sealed",
           "forget_old_runs", "note_not_run", "recent_runs", "run_of", "seal", "seal_order"]
