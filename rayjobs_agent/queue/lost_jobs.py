"""Jobs lost whole, seen by the queue's keeper: ended as lost when Ray's table says they run on a node that is gone,
and submitted again, by the spec's ``retry_on``, ``max_retries`` and backoff, whether anybody follows them or not.

A job whose entrypoint failed was decided about by the agent beside it, which retried it in place if it could; what
that agent cannot see is a job lost whole: its supervisor died, it never started, or its processes died with the
head node while Ray's table (kept in Redis) still says it runs. The next attempt is the same job request under
``<first id>-attemptN``, with the attempt's number and the first attempt's id in its metadata; a job of a queue
goes back into its queue at its first place. What was decided is published in the keeper's snapshot, where a
follower finds the next attempt.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from ..queueing import TERMINAL, Admission
from ..retries import ENTRYPOINT_FAILED, Failure, RetryPolicy, decide_retry
from ..wire import METADATA_ATTEMPT, METADATA_NAME, METADATA_PARENT, METADATA_PRIORITY, METADATA_QUEUE
from .ray_jobs import AlreadySubmitted, Refused, last_line
from .store import (RAY_JOB_INFO_PREFIX, RAY_JOB_NAMESPACE, KeyValue, enqueue, job_info_from, noted_attempt,
                    ray_job_info, retried_by_keeper)

# Ray's table is read for jobs lost whole this often.
WATCH_EVERY_S = 2.0

# A job lost whole is submitted again only when it was lost less than this long ago (a keeper that starts on a
# cluster does not resubmit what was lost there last week).
DECIDE_WITHIN_S = 3600.0

# A PENDING job whose supervisor does not exist this long after Ray took it is lost (Ray creates the supervisor as it
# takes the job: a moment without one is the job being submitted).
PENDING_GRACE_S = 10.0

# Decisions about jobs lost whole stay in the snapshot this long, for a follower to find the next attempt.
DECISION_SHOWN_S = 600.0


def decision_for_lost_job(job_id: str, info: Mapping[str, Any], attempts_made: int, now: float,
                          known: Callable[[str], str | None]) -> dict[str, Any] | None:
    """What becomes of job ``job_id`` that ended FAILED (``info``: Ray's record of it), by its spec's retry rule:
    ``retry``, and for a retry the next attempt's number, id (``next``) and when it is submitted (``due``).

    None when its entrypoint ran (the agent beside it decided, and retried it in place if it could). ``known``
    gives the status Ray's table has for an id, to choose the next attempt's id.
    """
    error_type = info.get("error_type")
    if not error_type or error_type == ENTRYPOINT_FAILED:
        return None
    env_vars = (info.get("runtime_env") or {}).get("env_vars") or {}
    if _stand_in_outcome(env_vars):
        # The stand-in of a job that never runs (stopped while it waited, or refused by Ray), lost before it ended.
        return {"retry": False, "at": now, "cause": error_type,
                "note": "it was never to run (stopped while it waited, or refused): no attempt follows"}
    try:
        policy = RetryPolicy.from_environment(env_vars)
    except Exception:  # noqa: BLE001 - a policy nobody can read retries nothing
        policy = RetryPolicy()
    decision = decide_retry(policy, Failure(error_type=error_type), attempts_made, again="the cluster submits")
    decided: dict[str, Any] = {"retry": decision.retry, "at": now, "cause": error_type, "note": decision.note or ""}
    if decision.retry:
        first = str((info.get("metadata") or {}).get(METADATA_PARENT) or job_id)
        decided.update(attempt=attempts_made + 1, first=first, due=now + decision.delay_s,
                       next=next_attempt_id(first, attempts_made + 1, known))
    return decided

def _stand_in_outcome(env_vars: Mapping[str, Any]) -> str:
    """How a stand-in ends (``STOPPED``, ``FAILED``); "" for a job that runs."""
    try:
        admission = Admission.from_environment(env_vars)
    except (ValueError, TypeError, KeyError):
        return ""
    return admission.outcome if admission is not None else ""

def retried_request(info: Mapping[str, Any], next_id: str, attempt: int, first: str) -> dict[str, Any]:
    """The job request of the next attempt of a job lost whole, rebuilt from Ray's record of the lost one."""
    request: dict[str, Any] = {"submission_id": next_id, "entrypoint": info.get("entrypoint") or "",
                               "runtime_env": info.get("runtime_env") or {},
                               "metadata": {**(info.get("metadata") or {}), METADATA_ATTEMPT: str(attempt),
                                            METADATA_PARENT: first}}
    for field in ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources"):
        if info.get(field):
            request[field] = info[field]
    return request

def next_attempt_id(first: str, attempt: int, known: Callable[[str], str | None]) -> str:
    """The id of attempt ``attempt`` of the run whose first attempt is ``first``: ``FIRST-attemptN``.

    ``known`` gives the status Ray's table has for an id (None: none). An attempt of that id that has already ended
    belongs to an earlier run of the same fixed id, so the next free ``FIRST-attemptN-K`` is taken.
    """
    candidate, again = f"{first}-attempt{attempt}", 1
    while True:
        status = known(candidate)
        if status is None or status not in TERMINAL:
            return candidate
        again += 1
        candidate = f"{first}-attempt{attempt}-{again}"

def _packages(request: Mapping[str, Any]) -> list[str]:
    runtime_env = request.get("runtime_env") or {}
    return [uri for uri in [runtime_env.get("working_dir"), *(runtime_env.get("py_modules") or [])]
            if isinstance(uri, str) and uri.startswith("gcs://")]

def _agent_modules(request: Mapping[str, Any]) -> list[str]:
    return [uri for uri in (request.get("runtime_env") or {}).get("py_modules") or []
            if isinstance(uri, str) and "rayjobs_agent" in uri]


class LostJobs:
    """What the keeper does for jobs lost whole: it finds them, decides their retry by their spec's rule, and submits
    the next attempt when its backoff has passed. Every decision is in the store, so a keeper that restarts goes on."""

    def __init__(self, store: KeyValue, jobs: Any, say: Callable[[str], None]) -> None:
        self.store = store
        self.jobs = jobs
        self.say = say
        self._missing_since: dict[str, float] = {}
        self._settled: set[str] = set()  # ended jobs whose fate is decided: Ray's table no longer changes for them

    def watch(self, now: float) -> None:
        """End as lost the jobs whose node is gone, and submit again, when due, those their retry rule retries.

        A job is lost when Ray's table says it runs on a node the cluster no longer has, or is PENDING without a
        supervisor, at two looks at least :data:`WATCH_EVERY_S` apart: after a head restart Ray's job manager never
        notices the first itself, and the second only after its start timeout.
        """
        alive: set[str] | None = None
        missing: dict[str, float] = {}
        listed = self.store.keys(RAY_JOB_INFO_PREFIX, namespace=RAY_JOB_NAMESPACE)
        # A job deleted from Ray's table is forgotten: its id may be submitted again, and is then looked at again.
        self._settled &= {key[len(RAY_JOB_INFO_PREFIX):] for key in listed}
        keys = [key for key in listed if key[len(RAY_JOB_INFO_PREFIX):] not in self._settled]
        for key, raw in self.store.multi_get(keys, namespace=RAY_JOB_NAMESPACE).items():
            info = {**job_info_from(raw), "submission_id": key[len(RAY_JOB_INFO_PREFIX):]}
            job_id = info["submission_id"]
            if not retried_by_keeper(job_id, info):
                continue  # not a job of rayjobs: its retry rule is not the keeper's to apply
            status = info.get("status")
            if status == "RUNNING" and info.get("driver_node_id"):
                if alive is None:
                    alive = self.store.alive_nodes()
                if alive and info["driver_node_id"] not in alive:
                    since = missing[job_id] = self._missing_since.get(job_id, now)
                    if now - since >= WATCH_EVERY_S:
                        node = str(info["driver_node_id"])[:12]
                        self.say(f"job {job_id} is lost: the node its driver ran on ({node}) is gone")
                        self.jobs.settle(job_id, "FAILED", f"lost with its node {node}, which is gone (found by the "
                                         "cluster queue's keeper)", lost=True)
                        info = {**info, "status": "FAILED", "error_type": "JOB_SUPERVISOR_ACTOR_DIED"}
                        status = "FAILED"
                        missing.pop(job_id)
            elif status == "PENDING" and self._never_to_start(job_id, info, now):
                since = missing[job_id] = self._missing_since.get(job_id, now)
                if now - since >= WATCH_EVERY_S:
                    self.say(f"job {job_id} is lost: its supervisor is gone before it started")
                    self.jobs.settle(job_id, "FAILED", "lost before it started: its supervisor is gone, with the node "
                                     "it was on (found by the cluster queue's keeper)", lost=True)
                    info = {**info, "status": "FAILED", "error_type": "JOB_SUPERVISOR_ACTOR_DIED"}
                    status = "FAILED"
                    missing.pop(job_id)
            if status == "FAILED" and self.store.get(f"lost/{job_id}") is None:
                self._decide_retry(job_id, info, now)
            if status in TERMINAL:
                self._settled.add(job_id)
        self._missing_since = missing
        for key in self.store.keys("retry/"):
            decided = json.loads(self.store.get(key) or b"{}")
            if float(decided.get("at") or 0) <= now:
                self._submit_again(key.partition("/")[2], decided, now)

    def _never_to_start(self, job_id: str, info: Mapping[str, Any], now: float) -> bool:
        """Whether a PENDING job has no supervisor, :data:`PENDING_GRACE_S` after Ray took it: it went with its node
        (the head, restarted), and Ray's job manager waits out its start timeout (15 minutes) before it says so."""
        has_supervisor = getattr(self.jobs, "has_supervisor", None)
        if has_supervisor is None or now - float(info.get("start_time") or now * 1000) / 1000 < PENDING_GRACE_S:
            return False
        return has_supervisor(job_id) is False

    def _decide_retry(self, job_id: str, info: Mapping[str, Any], now: float) -> None:
        if now - float(info.get("end_time") or now * 1000) / 1000 > DECIDE_WITHIN_S:
            return  # lost long before any keeper looked: a retry now would surprise more than help
        decided = decision_for_lost_job(job_id, info, self._attempts_made(job_id, info.get("metadata") or {}), now,
                                        lambda other: (ray_job_info(self.store, other) or {}).get("status"))
        if decided is None:
            return  # its entrypoint ran: the agent beside it decided, and retried it in place if it could
        if decided["retry"]:
            self.store.put(f"retry/{job_id}", json.dumps({**decided, "at": decided["due"]}).encode())
            self.say(f"job {job_id} was lost whole ({decided['cause']}); attempt {decided['attempt']} is submitted as "
                     f"{decided['next']} in {decided['due'] - now:g}s")
        self.store.put(f"lost/{job_id}", json.dumps(decided).encode())
        self.store.delete(f"attempts/{job_id}")

    def _attempts_made(self, job_id: str, metadata: Mapping[str, Any]) -> int:
        """How many attempts the run has made: the last one its wrapper started in place, else this submission's."""
        try:
            return noted_attempt(self.store, job_id) or int(metadata.get(METADATA_ATTEMPT) or 1)
        except (ValueError, TypeError):
            return 1

    def _submit_again(self, job_id: str, decided: Mapping[str, Any], now: float) -> None:
        info = ray_job_info(self.store, job_id)
        if info is None:
            self.store.delete(f"retry/{job_id}")  # deleted from Ray's table meanwhile: nothing to submit again
            return
        info = {**info, "submission_id": job_id}
        request = retried_request(info, str(decided["next"]), int(decided["attempt"]), str(decided["first"]))
        metadata = request["metadata"]
        queue = metadata.get(METADATA_QUEUE)
        if queue:
            # Back into its queue, at its first place: it waits for a slot as any job does.
            order = {"queue": queue, "id": request["submission_id"], "name": metadata.get(METADATA_NAME),
                     "priority": int(metadata.get(METADATA_PRIORITY) or 0), "request": request,
                     "needs": json.loads(self.store.get(f"needs/{job_id}") or b"{}"),
                     "packages": _packages(request), "agent_modules": _agent_modules(request)}
            # Its first place is where it entered its queue; Ray's start time (when its turn came) for a job let in
            # by a keeper that kept no place.
            place = json.loads(self.store.get(f"place/{job_id}") or b"{}").get("submitted")
            enqueue(self.store, order, float(place) if place is not None
                    else float(info.get("start_time") or now * 1000) / 1000)
        else:
            try:
                self.jobs.submit(request)
            except AlreadySubmitted:
                pass
            except Refused as exc:
                self.say(f"Ray refused attempt {decided['attempt']} of job {job_id}: {exc}")
            except Exception as exc:  # noqa: BLE001 - tried again at the next step
                self.say(f"could not submit attempt {decided['attempt']} of job {job_id} yet "
                         f"({type(exc).__name__}: {last_line(str(exc))})")
                return
        self.store.delete(f"retry/{job_id}")

    def _settle_lost(self, job_id: str, *, retry: bool, note: str) -> None:
        raw = self.store.get(f"lost/{job_id}")
        decided = json.loads(raw) if raw else {}
        self.store.put(f"lost/{job_id}", json.dumps({**decided, "retry": retry, "note": note}).encode())

    def decisions(self, now: float) -> dict[str, Any]:
        """The recent decisions about jobs lost whole, for a follower to find the next attempt of its job."""
        found = {}
        for key, raw in self.store.multi_get(self.store.keys("lost/")).items():
            decided = json.loads(raw)
            if now - float(decided.get("at") or 0) <= DECISION_SHOWN_S:
                found[key.partition("/")[2]] = decided
        return found


    def cancel(self, job_id: str) -> bool:
        """Submit no further attempt of job ``job_id`` (a lost job, or the attempt due after it); whether one was due."""
        for key in self.store.keys("retry/"):
            decided = json.loads(self.store.get(key) or b"{}")
            if job_id in (key.partition("/")[2], decided.get("next")):
                self.store.delete(key)
                self._settle_lost(key.partition("/")[2], retry=False, note="stopped before its next attempt")
                return True
        return False

    def next_attempt_of(self, job_id: str) -> str | None:
        """The attempt the keeper submitted (or entered into its queue) after job ``job_id`` was lost whole."""
        raw = self.store.get(f"lost/{job_id}")
        decided = json.loads(raw) if raw else {}
        return str(decided["next"]) if decided.get("retry") and decided.get("next") else None

    def packages(self) -> list[str]:
        """The ``gcs://`` packages of the jobs waiting for their next attempt: they must outlast the backoff."""
        return [uri for key in self.store.keys("retry/")
                for uri in _packages(ray_job_info(self.store, key.partition("/")[2]) or {})]

    def forget_deleted(self) -> None:
        """Drop what the store keeps of jobs deleted from Ray's table since: nothing more is decided about them."""
        for key in (self.store.keys("lost/") + self.store.keys("needs/") + self.store.keys("place/")
                    + self.store.keys("attempts/")):
            job_id = key.partition("/")[2]
            if ray_job_info(self.store, job_id) is None and self.store.get(f"retry/{job_id}") is None:
                self.store.delete(key)
