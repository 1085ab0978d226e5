"""A queue on a plain Ray cluster: a waiting job is an entry in the cluster's key-value store, not a process.

Ray starts every submitted job at once; jobs that do not fit wait PENDING or half-placed, in no
order, and give up after Ray's start timeout. A job of a queue (``queue:`` in its spec) is therefore
not submitted to Ray when it is submitted to rayjobs: its whole job request is written into the
cluster's key-value store (the GCS), and one small detached actor per cluster, the queue's keeper
(``queue_keeper.py``), submits it to Ray when its turn comes: its queue runs fewer jobs than its
limit, no job ahead of it waits, and the cluster has free what the job will use. Until then the job
costs the head one entry, a few KiB, where a waiting Ray job would cost its supervisor and wrapper
processes.

The store's namespace is ``rayjobs-queue``::

    limits/QUEUE                   {"max_running": N}, set by ``rayjobs queue set``
    waiting/QUEUE/ID               the job request of job ID, its priority, submission time and needs
    slot/QUEUE/I/GENERATION        {"id", "since", "needs"}: job ID runs in slot I (I < the limit)
    done/QUEUE/I/GENERATION        the job in that slot has ended
    stop/ID                        someone asked to stop job ID while it waited
    keeper                         the keeper's heartbeat: {"at", "version"}

A slot is taken by writing the generation after the one just read, and only if that key is absent,
which the store does atomically; a claim that finds a newer generation of its slot after writing
withdraws (a claimer that paused long enough may write a generation that was cleaned up). So of any
number of claimers racing for a slot, one holds it. A slot whose holder ended without saying so
(killed with its node) is free again as soon as Ray's job table says the job ended, and one whose
holder Ray does not know at all (deleted, or never submitted because its keeper died) once
:data:`UNKNOWN_HOLDER_GRACE_S` have passed by the head's clock. Order is priority (higher first),
then the time Ray took the submission, and only the first job in that order may take a slot: a large
job is never overtaken by smaller ones behind it.

Everything here that runs on the cluster is standard library only, but for the GCS client it is given.
When the head node restarts, the key-value store starts empty unless the cluster keeps the GCS in
Redis (GCS fault tolerance): the queue's limits must be set again, and jobs that were waiting are
gone with the rest of Ray's job table, as every job on that head is.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

from .wire import (METADATA_ENQUEUES, METADATA_NAME, METADATA_PRIORITY, METADATA_QUEUED_ID, RAY_JOB_CONFIG_ENV_VAR,
                   SUBMISSION_ID_KEY, ray_env_json)

NAMESPACE = b"rayjobs-queue"
# A queue's name goes into the store's keys, job metadata and log lines, and on Kubernetes into Kueue's
# LocalQueue label: what a Kubernetes name may be, and nothing a key's "/" or a shell could read.
QUEUE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
QUEUE_NAME_RULE = "1 to 63 lowercase letters, digits or '-', starting with a letter or digit"
# The job request a helper job enqueues, and the admission the keeper hands the job it submits.
REQUEST_ENV_VAR = "RAYJOBS_QUEUE_REQUEST"
ADMISSION_ENV_VAR = "RAYJOBS_QUEUE_ADMISSION"
# What a helper job prints its answer after, on one line of its log, and the name it runs under.
ANSWER_MARKER = "rayjobs-queue "
HELPER_NAME = "rayjobs-queue"
# A helper job that ended this long ago is deleted by the keeper, so that Ray's job list shows the team's jobs.
HELPER_KEPT_S = 30.0
# Ray's job manager keeps each submission's record here (ray.dashboard.modules.job.common.JobInfoStorageClient).
RAY_JOB_NAMESPACE = b"job"
RAY_JOB_INFO_PREFIX = "_ray_internal_job_info_"
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
# Ray counts a new job's workers as used once they are placed; until then, a job just let in is counted here.
PLACEMENT_GRACE_S = 10.0
# A slot whose holder Ray does not know frees after this long: the keeper writes a claim before it submits.
UNKNOWN_HOLDER_GRACE_S = 30.0
# An enqueue still on its way (its helper job submitted, its entry not yet written) holds back a job
# behind it in order for at most this long: a helper that never ran does not block its queue for good.
ENQUEUE_IN_FLIGHT_S = 60.0


class KeyValue(Protocol):
    """The cluster's key-value store, as the queue uses it."""

    def get(self, key: str, namespace: bytes = NAMESPACE) -> bytes | None: ...

    def put(self, key: str, value: bytes, *, only_if_absent: bool = False) -> bool: ...

    def delete(self, key: str) -> None: ...

    def keys(self, prefix: str, namespace: bytes = NAMESPACE) -> list[str]: ...

    def multi_get(self, keys: list[str], namespace: bytes = NAMESPACE) -> dict[str, bytes]: ...

    def free_resources(self) -> dict[str, float]: ...


class GcsKeyValue:
    """:class:`KeyValue` over the GCS of the cluster at ``address`` (no ``ray.init``: a helper job is no driver)."""

    def __init__(self, address: str) -> None:
        # Imported here: ray_internals loads Ray Train's callback interfaces, seconds that the keeper of a
        # job's record (every job) must not spend before its entrypoint starts.
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

    def keys(self, prefix: str, namespace: bytes = NAMESPACE) -> list[str]:
        """Every key that starts with ``prefix``."""
        return [key.decode() for key in self.client.internal_kv_keys(prefix.encode(), namespace)]

    def multi_get(self, keys: list[str], namespace: bytes = NAMESPACE) -> dict[str, bytes]:
        """The values of those ``keys`` that exist, in one request."""
        if not keys:
            return {}
        found = self.client.internal_kv_multi_get([key.encode() for key in keys], namespace)
        return {key.decode(): value for key, value in found.items()}

    def free_resources(self) -> dict[str, float]:
        """What the cluster's live nodes have free now, summed per resource."""
        from .ray_internals import free_resources

        return free_resources(self.client)

    def pin_package(self, uri: str, expiration_s: int) -> None:
        """Keep a ``gcs://`` package of a waiting job for ``expiration_s`` more: Ray deletes one no job references."""
        self.client.pin_runtime_env_uri(uri, expiration_s)


class QueueNameError(ValueError):
    """A queue's name outside :data:`QUEUE_NAME`."""


def checked_queue_name(name: str) -> str:
    """``name``, if it may name a queue; else :class:`QueueNameError` saying what a name may hold."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise QueueNameError(f"{name!r} cannot name a queue: use {QUEUE_NAME_RULE}")
    return name


@dataclass
class Slot:
    """One slot of a queue as last read: its newest generation, and who holds it (None: free)."""

    index: int
    generation: int
    holder: dict[str, Any] | None = None


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


def ray_job_info(store: KeyValue, job_id: str) -> dict[str, Any] | None:
    """The record Ray's job manager keeps of submission ``job_id`` (None when it has none)."""
    raw = store.get(RAY_JOB_INFO_PREFIX + job_id, namespace=RAY_JOB_NAMESPACE)
    return json.loads(raw) if raw else None


def job_status(store: KeyValue, job_id: str) -> str | None:
    """The status Ray's job manager keeps for submission ``job_id`` (None when it has none)."""
    info = ray_job_info(store, job_id)
    return str(info.get("status") or "") or None if info else None


def order_key(job_id: str, entry: dict[str, Any]) -> tuple[int, float, str]:
    """Where a waiting job goes: higher priority first, then the earlier submission, then its id."""
    return -int(entry.get("priority") or 0), float(entry.get("submitted") or 0), job_id


def waiting(store: KeyValue, queue: str) -> list[tuple[str, dict[str, Any]]]:
    """The jobs waiting in ``queue``, in the order they go."""
    keys = store.keys(f"waiting/{queue}/")
    found = store.multi_get(keys)
    entries = [(key.rpartition("/")[2], json.loads(raw)) for key, raw in found.items()]
    return sorted(entries, key=lambda item: order_key(*item))


def queues_in(store: KeyValue) -> list[str]:
    """Every queue the store knows: with a limit, a waiting job or a slot."""
    return sorted({key.split("/")[1] for prefix in ("limits/", "waiting/", "slot/") for key in store.keys(prefix)})


def slots(store: KeyValue, queue: str, now: float) -> dict[int, Slot]:
    """Every slot of ``queue`` that has been taken, with its newest generation and its holder, if it still has one.

    A holder is gone when it said so (``done``), when Ray's job table says its job ended, or when Ray
    does not know its job and its claim is older than :data:`UNKNOWN_HOLDER_GRACE_S` (``now`` is the
    head's clock, which wrote ``since``).
    """
    newest: dict[int, int] = {}
    for key in store.keys(f"slot/{queue}/"):
        _, _, index, generation = key.split("/")
        newest[int(index)] = max(newest.get(int(index), -1), int(generation))
    found = {}
    for index, generation in newest.items():
        found[index] = Slot(index, generation, None)
        if store.get(f"done/{queue}/{index}/{generation}") is not None:
            continue
        raw = store.get(f"slot/{queue}/{index}/{generation}")
        holder = json.loads(raw) if raw else None
        if holder is None:
            continue
        status = job_status(store, str(holder.get("id")))
        if status in TERMINAL:
            continue
        if status is None and now - float(holder.get("since") or 0) > UNKNOWN_HOLDER_GRACE_S:
            continue
        found[index].holder = holder
    return found


def held(slot_map: dict[int, Slot]) -> dict[int, dict[str, Any]]:
    """Slot → holder, for the slots that are held."""
    return {index: slot.holder for index, slot in slot_map.items() if slot.holder is not None}


def free_slot(slot_map: dict[int, Slot], limit: int | None) -> Slot | None:
    """The lowest slot a job may take now (below ``limit``), or None when the queue is full."""
    holders = held(slot_map)
    if limit is not None and len(holders) >= limit:
        return None
    for index in range(limit if limit is not None else len(holders) + 1):
        if index not in holders:
            return slot_map.get(index, Slot(index, -1))
    return None


def claim(store: KeyValue, queue: str, slot: Slot, holder: dict[str, Any], pause: Any = None) -> int | None:
    """Take ``slot`` for ``holder`` at the generation after the one read; the generation taken, or None when lost.

    ``pause`` (tests only) is called between the put and the check that follows it.
    """
    generation = slot.generation + 1
    key = f"slot/{queue}/{slot.index}/{generation}"
    if not store.put(key, json.dumps(holder).encode(), only_if_absent=True):
        return None
    if pause is not None:
        pause()
    # A generation above ours means we read a state that was long gone (ours had been cleaned up): withdraw.
    if any(int(other.rpartition("/")[2]) > generation for other in store.keys(f"slot/{queue}/{slot.index}/")):
        store.delete(key)
        return None
    return generation


def release(store: KeyValue, queue: str, index: int, generation: int) -> None:
    """Give slot ``index`` back: its job has ended. Older generations are removed (the newest one stays)."""
    store.put(f"done/{queue}/{index}/{generation}", b"1")
    for older in range(max(0, generation - 2), generation):
        store.delete(f"slot/{queue}/{index}/{older}")
        store.delete(f"done/{queue}/{index}/{older}")


def admitted_recently(store: KeyValue, now: float) -> dict[str, float]:
    """What jobs let in during the last :data:`PLACEMENT_GRACE_S`, in any queue, will use but may not hold yet."""
    pending: dict[str, float] = {}
    keys = store.keys("slot/")
    for key, raw in store.multi_get(keys).items():
        holder = json.loads(raw)
        if now - float(holder.get("since") or 0) >= PLACEMENT_GRACE_S:
            continue
        _, queue, index, generation = key.split("/")
        if store.get(f"done/{queue}/{index}/{generation}") is None:
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


def ray_jobs(store: KeyValue) -> list[dict[str, Any]]:
    """Every record of Ray's job table, read in one request."""
    keys = store.keys(RAY_JOB_INFO_PREFIX, namespace=RAY_JOB_NAMESPACE)
    return [{**json.loads(raw), "submission_id": key[len(RAY_JOB_INFO_PREFIX):]}
            for key, raw in store.multi_get(keys, namespace=RAY_JOB_NAMESPACE).items()]


def finished_helpers(store: KeyValue, now: float) -> list[str]:
    """The helper jobs that ended more than :data:`HELPER_KEPT_S` ago (their answer has long been read)."""
    return [info["submission_id"] for info in ray_jobs(store)
            if (info.get("metadata") or {}).get(METADATA_NAME) == HELPER_NAME and info.get("status") in TERMINAL
            and now - (info.get("end_time") or 0) / 1000 > HELPER_KEPT_S]


def enqueues_in_flight(store: KeyValue, queue: str, now: float) -> list[tuple[str, dict[str, Any]]]:
    """Jobs submitted to ``queue`` whose entry is still being written: helper jobs that have not ended.

    Their place is known from Ray's job table (the helper's submission time and the metadata it
    carries), so a job submitted a moment ago is not overtaken by one behind it in order while its
    helper starts.
    """
    found = []
    for info in ray_jobs(store):
        metadata = info.get("metadata") or {}
        if metadata.get(METADATA_ENQUEUES) != queue or info.get("status") in TERMINAL:
            continue
        submitted = (info.get("start_time") or 0) / 1000
        if now - submitted > ENQUEUE_IN_FLIGHT_S:
            continue
        found.append((str(metadata.get(METADATA_QUEUED_ID) or ""), {"priority": metadata.get(METADATA_PRIORITY) or 0,
                                                                    "submitted": submitted}))
    return found


def describe(store: KeyValue, now: float, queue: str | None = None,
             reasons: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every queue (or the one named): its limit, the jobs running in it and those waiting, in the order they go.

    ``reasons`` gives why the first job of a queue waits, when the keeper knows it.
    """
    found = []
    for name in ([queue] if queue is not None else queues_in(store)):
        limit = max_running(store, name)
        holders = held(slots(store, name, now))
        running = [{"id": holder.get("id"), "name": holder.get("name"), "slot": index, "since": holder.get("since"),
                    "needs": holder.get("needs")} for index, holder in sorted(holders.items())]
        listed = []
        for position, (job_id, entry) in enumerate(waiting(store, name), start=1):
            reason = (reasons or {}).get(job_id) or (f"{position - 1} ahead of it" if position > 1 else "")
            listed.append({"id": job_id, "name": entry.get("name"), "position": position,
                           "priority": entry.get("priority", 0), "submitted": entry.get("submitted"),
                           "needs": entry.get("needs") or {}, "spec_hash": entry.get("spec_hash"), "reason": reason})
        found.append({"queue": name, "max_running": limit, "running": running, "waiting": listed})
    return found


def agent_version() -> str:
    """A hash of this package's code: a keeper started by other code is replaced, not trusted."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in sorted(package.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def submission_id_from(environ: Any) -> str:
    """The job's submission id, from the job config Ray hands its driver ("" when there is none)."""
    try:
        metadata = json.loads(environ.get(RAY_JOB_CONFIG_ENV_VAR) or "{}").get("metadata") or {}
    except ValueError:
        return ""
    return str(metadata.get(SUBMISSION_ID_KEY) or "")


@dataclass
class Admission:
    """What the keeper hands a job it submits (``RAYJOBS_QUEUE_ADMISSION``): its slot, and how long it waited.

    ``outcome`` is set on a job that never runs: it was stopped while it waited (``STOPPED``), or Ray
    refused its request (``FAILED``, with ``reason``). Its wrapper then ends it so, with its record.
    """

    queue: str
    slot: int = -1
    generation: int = -1
    waited_s: float = 0.0
    position: int = 0
    outcome: str = ""
    reason: str = ""
    # When the keeper let it in (the head's clock): the queue's order, whichever wrapper starts first.
    admitted_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The variable's value (JSON, with ``$`` escaped: Ray expands ``$NAME`` in every variable it sets)."""
        document = {"queue": self.queue, "slot": self.slot, "generation": self.generation,
                    "waited_s": round(self.waited_s, 3), "position": self.position, "outcome": self.outcome,
                    "reason": self.reason, "admitted_at": round(self.admitted_at, 6)}
        return ray_env_json(document)

    @classmethod
    def from_environment(cls, environ: Any) -> Admission | None:
        """The admission a job was started with, or None (a job not started by a queue's keeper)."""
        text = environ.get(ADMISSION_ENV_VAR)
        if not text:
            return None
        document = json.loads(text)
        return cls(str(document["queue"]), int(document.get("slot", -1)), int(document.get("generation", -1)),
                   float(document.get("waited_s") or 0), int(document.get("position") or 0),
                   str(document.get("outcome") or ""), str(document.get("reason") or ""),
                   float(document.get("admitted_at") or 0.0))


# Ray caps one variable's value at what the kernel takes for one string of a process's environment (128 KiB):
# a large order is split over numbered variables.
_ORDER_CHUNK_CHARS = 96 * 1024


def order_variables(order: dict[str, Any]) -> dict[str, str]:
    """A helper job's order as its variables: compressed, base64 (nothing for Ray to expand), split when large."""
    text = base64.b64encode(zlib.compress(json.dumps(order).encode(), 9)).decode()
    chunks = [text[start:start + _ORDER_CHUNK_CHARS] for start in range(0, len(text), _ORDER_CHUNK_CHARS)] or [""]
    return {REQUEST_ENV_VAR if index == 0 else f"{REQUEST_ENV_VAR}_{index}": chunk
            for index, chunk in enumerate(chunks)}


def order_from(environ: Mapping[str, str]) -> dict[str, Any]:
    """The order :func:`order_variables` wrote, read back from a helper job's environment."""
    chunks, index = [environ.get(REQUEST_ENV_VAR) or ""], 1
    while f"{REQUEST_ENV_VAR}_{index}" in environ:
        chunks.append(environ[f"{REQUEST_ENV_VAR}_{index}"])
        index += 1
    return json.loads(zlib.decompress(base64.b64decode("".join(chunks))))


def answer(document: Any) -> None:
    """Print a helper job's answer, the one line its caller reads back."""
    print(ANSWER_MARKER + json.dumps(document), flush=True)
