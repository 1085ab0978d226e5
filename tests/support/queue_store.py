"""The cluster queue's store in memory, and Ray's job API as the queue's keeper uses it, for the queue's unit tests.

The cluster's own store is used by the queue's cluster tests; here the one seam, the store, is a dict
whose put-if-absent is atomic (one lock), as the GCS's is.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any
from rayjobs_agent import queueing as q
from rayjobs_agent.queue import store as qs



class Clock:
    """The head's clock, moved by the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class DictStore:
    """The key-value store's contract in memory, with Ray's job table beside it (``set_job_status``)."""

    def __init__(self, free: dict[str, float] | None = None) -> None:
        self.data: dict[tuple[bytes, str], bytes] = {}
        self.lock = threading.Lock()
        self.free = free if free is not None else {"CPU": 100.0}
        self.pinned: list[tuple[str, int]] = []
        # What Ray shows placed for each job (submission id → resources), and the cluster's live nodes.
        self.placed: dict[str, dict[str, float]] = {}
        self.nodes: set[str] = {"node-1"}

    def get(self, key: str, namespace: bytes = q.NAMESPACE) -> bytes | None:
        return self.data.get((namespace, key))

    def put(self, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        with self.lock:
            if only_if_absent and (q.NAMESPACE, key) in self.data:
                return False
            self.data[(q.NAMESPACE, key)] = value
            return True

    def delete(self, key: str) -> None:
        self.data.pop((q.NAMESPACE, key), None)

    def keys(self, prefix: str, namespace: bytes = q.NAMESPACE) -> list[str]:
        return [key for space, key in list(self.data) if space == namespace and key.startswith(prefix)]

    def multi_get(self, keys: list[str], namespace: bytes = q.NAMESPACE) -> dict[str, bytes]:
        return {key: self.data[(namespace, key)] for key in keys if (namespace, key) in self.data}

    def free_resources(self) -> dict[str, float]:
        return dict(self.free)

    def placed_resources(self, job_ids: list[str]) -> dict[str, dict[str, float]]:
        return {job_id: dict(self.placed.get(job_id) or {}) for job_id in job_ids}

    def alive_nodes(self) -> set[str]:
        return set(self.nodes)

    def pin_package(self, uri: str, expiration_s: int) -> None:
        self.pinned.append((uri, expiration_s))

    def set_job_status(self, job_id: str, status: str | None, **info: Any) -> None:
        """What Ray's job table says of ``job_id`` (None: it has no record of it); ``info`` adds to what it had."""
        key = (qs.RAY_JOB_NAMESPACE, qs.RAY_JOB_INFO_PREFIX + job_id)
        if status is None:
            self.data.pop(key, None)
        else:
            before = json.loads(self.data[key]) if key in self.data else {}
            if "runtime_env" in info:  # Ray's job manager keeps it as a JSON string
                info["runtime_env_json"] = json.dumps(info.pop("runtime_env"))
            self.data[key] = json.dumps({**before, "status": status, **info}).encode()

    def order(self, order_id: str, order: dict[str, Any], *, start_time_ms: float = 0.0,
              metadata: dict[str, str] | None = None) -> None:
        """An order job as a client submits it (``queueing.order_submission``), waiting PENDING in Ray's table."""
        request = q.order_submission(order, order_id, ["gcs://agent.zip"], metadata)
        self.set_job_status(order_id, "PENDING", start_time=start_time_ms, runtime_env=request["runtime_env"],
                            metadata=request["metadata"], entrypoint=request["entrypoint"])


class FakeRayJobs:
    """Ray's job API as the keeper calls it: submissions land in the store's job table as RUNNING."""

    def __init__(self, store: DictStore) -> None:
        self.store = store
        self.submitted: list[dict[str, Any]] = []
        self.stopped: list[str] = []
        self.deleted: list[str] = []
        self.refuse: dict[str, Exception] = {}
        self.settled: list[tuple[str, str, str]] = []
        self.clock: Any = time.time  # the head's clock, which stamps the end of what it settles

    def submit(self, request: dict[str, Any]) -> None:
        job_id = request["submission_id"]
        if job_id in self.refuse:
            raise self.refuse.pop(job_id)
        if qs.job_status(self.store, job_id) is not None:
            from rayjobs_agent.queue.ray_jobs import AlreadySubmitted

            raise AlreadySubmitted(job_id)
        self.submitted.append(request)
        self.store.set_job_status(job_id, "RUNNING", metadata=request.get("metadata") or {},
                                  runtime_env=request.get("runtime_env") or {}, entrypoint=request.get("entrypoint"),
                                  driver_node_id="node-1")

    def settle(self, job_id: str, status: str, message: str, *, lost: bool = False) -> None:
        self.settled.append((job_id, status, message))
        extra = {"error_type": "JOB_SUPERVISOR_ACTOR_DIED"} if lost else {}
        self.store.set_job_status(job_id, status, message=message, end_time=self.clock() * 1000, **extra)

    def answer_to(self, order_id: str) -> Any:
        """The keeper's answer to an order, as it ended the order's job."""
        return q.answer_in(next(message for job_id, _, message in self.settled if job_id == order_id))

    def stop(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        if qs.job_status(self.store, job_id) == "RUNNING":
            self.store.set_job_status(job_id, "STOPPED")
            return True
        return False

    def delete(self, job_id: str) -> None:
        self.deleted.append(job_id)
        self.store.set_job_status(job_id, None)

    def ids(self) -> list[str]:
        """The submitted jobs' ids, in order."""
        return [request["submission_id"] for request in self.submitted]


def enter(store: DictStore, job_id: str, *, queue: str = "team-a", priority: int = 0, submitted: float = 0.0,
          needs: dict[str, float] | None = None) -> None:
    """Write job ``job_id``'s entry as a helper job would."""
    entry = {"name": job_id, "priority": priority, "submitted": submitted,
             "needs": needs if needs is not None else {"CPU": 1.0}}
    store.put(f"request/{job_id}", json.dumps({"submission_id": job_id, "entrypoint": f"python -m rayjobs_agent."
                                               f"supervisor -- 'echo {job_id}'", "metadata": {}}).encode())
    store.put(f"waiting/{queue}/{job_id}", json.dumps(entry).encode())


def keeper_and_jobs(store: DictStore, clock: Clock | None = None,
                    send_notification: Any = None) -> tuple[Any, FakeRayJobs, list[str]]:
    """A keeper over ``store`` on the head's clock ``clock``, Ray's job API it calls (whose ends that clock stamps),
    and what it said; ``send_notification`` stands in for ``notify.send`` (default: the real one)."""
    from rayjobs_agent.queue.keeper import Keeper

    jobs, said = FakeRayJobs(store), []
    jobs.clock = clock = clock or Clock()
    options = {"send_notification": send_notification} if send_notification is not None else {}
    return Keeper(store, jobs, clock=clock, say=said.append, **options), jobs, said
