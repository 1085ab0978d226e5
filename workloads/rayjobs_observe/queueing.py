"""A queue on a plain Ray cluster: a queued job waits for its turn in its own wrapper, before its entrypoint starts.

Ray starts every submitted job at once; jobs that do not fit wait PENDING or half-placed, in no
order, and give up after Ray's start timeout. Here a job of a queue (``queue:`` in its spec) is
submitted to Ray as usual, and the run record's keeper (``record.py``) holds its entrypoint back
until the job's turn comes: its queue runs fewer jobs than its limit, no job ahead of it waits, and
the cluster has free what the job will use. Until then the job asks Ray for nothing but its wrapper.

The queue's state lives in the cluster's own key-value store (the GCS), namespace ``rayjobs-queue``,
so a submitter that goes away loses nothing and no process outside Ray has to stay up::

    limits/QUEUE                   {"max_running": N}, set by ``rayjobs queue set``
    waiting/QUEUE/ID               {"priority", "submitted", "needs"} while job ID waits
    slot/QUEUE/I/GENERATION        {"id", "since", "needs"}: job ID runs in slot I
    done/QUEUE/I/GENERATION        the job in that slot has ended

A slot is taken by writing its next generation only if that key is absent, which the store does
atomically: of two jobs racing for the last slot, one wins and the other waits. A slot whose holder
ended without saying so (killed with its node) is known free from Ray's own job table. Order is
priority (higher first), then the time Ray took the submission, and only the first job in that order
may take a slot: a large job is never overtaken by smaller ones behind it.

When the head node restarts, the key-value store starts empty unless the cluster keeps the GCS in
Redis (GCS fault tolerance): the queue's limits must be set again, and jobs that were waiting are
gone with the rest of Ray's job table, as every job on that head is.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .vocabulary import EventKind

NAMESPACE = b"rayjobs-queue"
# Ray's job manager keeps each submission's status here (ray.dashboard.modules.job.common.JobInfoStorageClient).
_RAY_JOB_NAMESPACE = b"job"
_RAY_JOB_INFO_KEY = "_ray_internal_job_info_{}"
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
# Ray counts a new job's workers as used once they are placed; until then, a job just let in is counted here.
PLACEMENT_GRACE_S = 10.0
POLL_S = 0.25


class KeyValue(Protocol):
    """The cluster's key-value store, as the queue uses it."""

    def get(self, key: str, namespace: bytes = NAMESPACE) -> bytes | None: ...

    def put(self, key: str, value: bytes, *, only_if_absent: bool = False) -> bool: ...

    def delete(self, key: str) -> None: ...

    def keys(self, prefix: str) -> list[str]: ...

    def free_resources(self) -> dict[str, float]: ...


class GcsKeyValue:
    """:class:`KeyValue` over the GCS of the cluster at ``address`` (no ``ray.init``: the wrapper is no driver)."""

    def __init__(self, address: str) -> None:
        # Imported here: ray_internals loads Ray Train's callback interfaces, seconds the keeper of a job
        # with no queue (every job) must not spend before its entrypoint starts.
        from .ray_internals import gcs_client

        self.client = gcs_client(address)

    def get(self, key: str, namespace: bytes = NAMESPACE) -> bytes | None:
        """The value at ``key``, or None."""
        return self.client.internal_kv_get(key.encode(), namespace)

    def put(self, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        """Write ``key``; with ``only_if_absent``, only when nobody has: returns whether this call wrote it."""
        return self.client.internal_kv_put(key.encode(), value, not only_if_absent, NAMESPACE) == 1 \
            or not only_if_absent

    def delete(self, key: str) -> None:
        """Remove ``key``."""
        self.client.internal_kv_del(key.encode(), False, NAMESPACE)

    def keys(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``."""
        return [key.decode() for key in self.client.internal_kv_keys(prefix.encode(), NAMESPACE)]

    def free_resources(self) -> dict[str, float]:
        """What the cluster's live nodes have free now, summed per resource."""
        from .ray_internals import free_resources

        return free_resources(self.client)


@dataclass
class Turn:
    """What one look at the queue found: a slot to take, or why the job waits (position 1 is next)."""

    slot: int | None = None
    generation: int = 0
    position: int = 0
    reason: str = ""


@dataclass
class Admission:
    """A job's place in its queue, from the moment it waits to the moment its entrypoint ends."""

    store: KeyValue
    queue: str
    job_id: str
    priority: int = 0
    needs: dict[str, float] = field(default_factory=dict)
    submitted: float = 0.0
    slot: tuple[int, int] | None = None

    def register(self) -> None:
        """Join the waiting list (idempotent: a restarted wrapper of the same job keeps its place)."""
        entry = {"priority": self.priority, "submitted": self.submitted, "needs": self.needs}
        self.store.put(f"waiting/{self.queue}/{self.job_id}", json.dumps(entry).encode())

    def look(self, now: float) -> Turn:
        """Whether the job may start now, and take its slot if so (nothing changes when it may not)."""
        waiting = live_waiting(self.store, self.queue)
        order = sorted(waiting, key=lambda item: (-int(item[1].get("priority", 0)),
                                                  float(item[1].get("submitted", 0)), item[0]))
        position = next((index + 1 for index, (job, _) in enumerate(order) if job == self.job_id), len(order) + 1)
        limit = max_running(self.store, self.queue)
        holders = held_slots(self.store, self.queue)
        running = len(holders)
        if position > 1:
            ahead = order[0][0]
            return Turn(position=position, reason=f"{position - 1} ahead of it in queue {self.queue} "
                        f"(next: {ahead}); {running} of {limit if limit is not None else 'unlimited'} running")
        if limit is not None and running >= limit:
            return Turn(position=position, reason=f"{running} of {limit} running in queue {self.queue}")
        short = shortfall(self.needs, self.store.free_resources(), recently_started(self.store, now))
        if short:
            return Turn(position=position, reason=short)
        slot, generation = next_free_slot(self.store, self.queue, holders)
        value = {"id": self.job_id, "since": now, "needs": self.needs}
        if not self.store.put(f"slot/{self.queue}/{slot}/{generation}", json.dumps(value).encode(),
                              only_if_absent=True):
            return Turn(position=position, reason=f"another job took slot {slot} of queue {self.queue} first")
        self.slot = (slot, generation)
        self.store.delete(f"waiting/{self.queue}/{self.job_id}")
        return Turn(slot=slot, generation=generation, position=0)

    def leave(self) -> None:
        """Give the slot back (or leave the waiting list): the job has ended, or was stopped while it waited."""
        if self.slot is None:
            self.store.delete(f"waiting/{self.queue}/{self.job_id}")
            return
        slot, generation = self.slot
        self.store.put(f"done/{self.queue}/{slot}/{generation}", b"1")
        for older in range(max(0, generation - 2), generation):  # keeps the store from growing with every run
            self.store.delete(f"slot/{self.queue}/{slot}/{older}")
            self.store.delete(f"done/{self.queue}/{slot}/{older}")


def wait_for_turn(admission: Admission, stopped: Callable[[], bool], tell: Callable[[dict[str, Any]], None],
                  clock: Callable[[], float] = time.time, pause: Callable[[float], None] = time.sleep) -> bool:
    """Wait until ``admission`` takes a slot (True) or ``stopped()`` (False, having left the list).

    ``tell`` hears ``{"state": "waiting", "position", "reason"}`` each time the position or reason
    changes, and ``{"state": "admitted", "waited_s", "slot"}`` once.
    """
    started = clock()
    admission.register()
    said: tuple[int, str] | None = None
    while not stopped():
        turn = admission.look(clock())
        if turn.slot is not None:
            tell({"state": "admitted", "queue": admission.queue, "slot": turn.slot,
                  "waited_s": round(clock() - started, 3)})
            return True
        if (turn.position, turn.reason) != said:
            said = (turn.position, turn.reason)
            tell({"state": "waiting", "queue": admission.queue, "position": turn.position, "reason": turn.reason})
        pause(POLL_S)
    admission.leave()
    return False


def max_running(store: KeyValue, queue: str) -> int | None:
    """The queue's limit on jobs running at once (None: no limit set on the cluster)."""
    raw = store.get(f"limits/{queue}")
    if not raw:
        return None
    value = json.loads(raw).get("max_running")
    return int(value) if value is not None else None


def set_limits(store: KeyValue, queue: str, max_running_jobs: int | None) -> None:
    """Set the queue's limit on the cluster (None removes it)."""
    if max_running_jobs is None:
        store.delete(f"limits/{queue}")
    else:
        store.put(f"limits/{queue}", json.dumps({"max_running": max_running_jobs}).encode())


def job_status(store: KeyValue, job_id: str) -> str | None:
    """The status Ray's job manager keeps for submission ``job_id`` (None when it has none)."""
    raw = store.get(_RAY_JOB_INFO_KEY.format(job_id), namespace=_RAY_JOB_NAMESPACE)
    if not raw:
        return None
    return str(json.loads(raw).get("status") or "") or None


def live_waiting(store: KeyValue, queue: str) -> list[tuple[str, dict[str, Any]]]:
    """The jobs waiting in ``queue``; an entry whose job has ended (stopped or killed while waiting) is removed."""
    found = []
    for key in store.keys(f"waiting/{queue}/"):
        job_id = key.rpartition("/")[2]
        raw = store.get(key)
        if raw is None:
            continue
        if job_status(store, job_id) in TERMINAL:
            store.delete(key)
            continue
        found.append((job_id, json.loads(raw)))
    return found


def held_slots(store: KeyValue, queue: str) -> dict[int, tuple[int, dict[str, Any]]]:
    """Slot → (generation, holder) for every slot of ``queue`` held by a job that has not ended."""
    latest: dict[int, int] = {}
    for key in store.keys(f"slot/{queue}/"):
        _, _, slot, generation = key.split("/")
        latest[int(slot)] = max(latest.get(int(slot), -1), int(generation))
    held = {}
    for slot, generation in latest.items():
        if store.get(f"done/{queue}/{slot}/{generation}") is not None:
            continue
        raw = store.get(f"slot/{queue}/{slot}/{generation}")
        holder = json.loads(raw) if raw else {}
        if job_status(store, str(holder.get("id"))) in TERMINAL:
            continue
        held[slot] = (generation, holder)
    return held


def next_free_slot(store: KeyValue, queue: str, held: dict[int, tuple[int, dict[str, Any]]]) -> tuple[int, int]:
    """The lowest slot not held, and the generation that takes it."""
    slot = next(index for index in range(len(held) + 1) if index not in held)
    generations = [int(key.rpartition("/")[2]) for key in store.keys(f"slot/{queue}/{slot}/")]
    return slot, max(generations, default=-1) + 1


def recently_started(store: KeyValue, now: float) -> dict[str, float]:
    """What jobs let in during the last :data:`PLACEMENT_GRACE_S`, in any queue, will use but may not hold yet."""
    pending: dict[str, float] = {}
    for key in store.keys("slot/"):
        raw = store.get(key)
        holder = json.loads(raw) if raw else {}
        if now - float(holder.get("since", 0)) < PLACEMENT_GRACE_S:
            _, queue, slot, generation = key.split("/")
            if store.get(f"done/{queue}/{slot}/{generation}") is None:
                for name, amount in (holder.get("needs") or {}).items():
                    pending[name] = pending.get(name, 0.0) + float(amount)
    return pending


def shortfall(needs: dict[str, float], free: dict[str, float], pending: dict[str, float]) -> str:
    """Why ``needs`` does not fit what is ``free`` less what is ``pending`` ("" when it fits)."""
    for name, amount in sorted(needs.items()):
        available = free.get(name, 0.0) - pending.get(name, 0.0)
        if amount > available + 1e-9:
            unit = f"{name}s" if name in ("CPU", "GPU") and amount != 1 else name
            return f"needs {amount:g} {unit}, {max(available, 0):g} free"
    return ""


def admission_from_environment(config: dict[str, Any], job_id: str, environ: Any = os.environ) -> Admission | None:
    """The admission a queued job's record config asks for (None when the job is in no queue)."""
    queue = (config or {}).get("queue")
    if not queue:
        return None
    if not job_id:
        raise RuntimeError("the job's submission id is unknown here")
    store = GcsKeyValue(environ["RAY_ADDRESS"])
    raw = store.get(_RAY_JOB_INFO_KEY.format(job_id), namespace=_RAY_JOB_NAMESPACE)
    # Ray's own time of submission (ms), so that order does not depend on how fast each wrapper started.
    submitted = (json.loads(raw).get("start_time") or 0) / 1000 if raw else time.time()
    return Admission(store, str(queue["name"]), job_id, int(queue.get("priority") or 0),
                     {name: float(amount) for name, amount in (queue.get("needs") or {}).items()},
                     submitted or time.time())


def describe(store: KeyValue, queue: str | None = None) -> list[dict[str, Any]]:
    """Every queue (or the one named): its limit, the jobs running in it and those waiting, in the order they go."""
    names = {key.split("/")[1] for prefix in ("limits/", "waiting/", "slot/") for key in store.keys(prefix)}
    found = []
    for name in sorted(names if queue is None else {queue}):
        waiting = sorted(live_waiting(store, name), key=lambda item: (-int(item[1].get("priority", 0)),
                                                                     float(item[1].get("submitted", 0)), item[0]))
        running = [{"id": holder.get("id"), "slot": slot, "since": holder.get("since"), "needs": holder.get("needs")}
                   for slot, (_, holder) in sorted(held_slots(store, name).items())]
        found.append({"queue": name, "max_running": max_running(store, name), "running": running,
                      "waiting": [{"id": job, "position": index + 1, **entry}
                                  for index, (job, entry) in enumerate(waiting)]})
    return found


def main(argv: list[str]) -> int:
    """``python -m rayjobs_observe.queueing set QUEUE MAX_RUNNING|none`` or ``show [QUEUE]``, run on the cluster.

    ``rayjobs queue`` runs these as a small job, so that they work wherever a job can be submitted
    (the cluster's key-value store is not reachable from outside it on most clusters).
    """
    store = GcsKeyValue(os.environ["RAY_ADDRESS"])
    if len(argv) == 3 and argv[0] == "set":
        set_limits(store, argv[1], None if argv[2] == "none" else int(argv[2]))
        argv = ["show", argv[1]]
    if argv and argv[0] == "show" and len(argv) <= 2:
        print(f"rayjobs-queue {json.dumps(describe(store, argv[1] if len(argv) == 2 else None))}", flush=True)
        return 0
    print("usage: python -m rayjobs_observe.queueing set QUEUE N|none | show [QUEUE]", flush=True)
    return 2


def wait_in_queue(config: dict[str, Any], job_id: str, stopped: Callable[[], bool],
                  emit: Callable[..., None], say: Callable[[str], None]) -> tuple[Admission | None, bool]:
    """The record keeper's part: hold the entrypoint until the job's turn comes.

    Returns:
        The admission to give back when the entrypoint ends (None for a job in no queue, or when the
        queue could not be read), and whether the entrypoint should start at all (False: stopped while
        waiting). A queue that cannot be read lets the job run, said once: the queue must not be why a
        job never runs.
    """
    try:
        admission = admission_from_environment(config, job_id)
    except Exception as exc:  # noqa: BLE001 - any failure of the queue's own machinery
        say(f"queue unavailable: {_first_line(exc)}; the job starts without waiting")
        return None, True
    if admission is None:
        return None, True

    def tell(state: dict[str, Any]) -> None:
        emit(EventKind.QUEUE, **state)
        if state["state"] == "waiting":
            say(f"queued in {state['queue']}, position {state['position']}: {state['reason']}")
        else:
            say(f"starting: its turn in queue {state['queue']} came after {state['waited_s']:.1f}s")

    try:
        return admission, wait_for_turn(admission, stopped, tell)
    except Exception as exc:  # noqa: BLE001
        say(f"queue unavailable: {_first_line(exc)}; the job starts without waiting")
        return None, True


def release(admission: Admission | None, say: Callable[[str], None]) -> None:
    """Give the job's slot back once its entrypoint has ended (a failure is said, never raised)."""
    if admission is None:
        return
    try:
        admission.leave()
    except Exception as exc:  # noqa: BLE001 - Ray's job table frees the slot once the job has ended anyway
        say(f"could not give back the queue slot ({_first_line(exc)}); it frees itself when the job ends")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def submission_id_from(environ: Any) -> str:
    """The job's submission id, from the job config Ray hands its driver ("" when there is none)."""
    try:
        metadata = json.loads(environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("metadata") or {}
    except ValueError:
        return ""
    return str(metadata.get("job_submission_id") or "")


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
