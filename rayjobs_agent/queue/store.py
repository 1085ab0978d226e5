"""The queue's state in the cluster's key-value store (the GCS), its layout, and the rules read from it.

The store's namespace is ``rayjobs-queue``::

    limits/QUEUE                   {"max_running": N, "quota": {RESOURCE: AMOUNT}}, set by ``rayjobs queue set``
    waiting/QUEUE/ID               the job request of job ID, its priority, submission time and needs
    request/ID                     job ID's request, as Ray's job API takes it
    slot/QUEUE/I/GENERATION        {"id", "since", "needs"}: job ID runs in slot I (I < the limit)
    done/QUEUE/I/GENERATION        the job in that slot has ended
    stop/ID                        someone asked to stop job ID while it waited (written by a helper job)
    needs/ID                       what job ID declared it needs, kept while it runs (for its next attempt)
    place/ID                       {"submitted"}: where job ID entered its queue, kept while it runs (ditto)
    attempts/ID                    the attempt job ID's wrapper started last, when it retries in place
    lost/ID                        job ID ended lost whole, and what the keeper decided about its next attempt
    retry/ID                       job ID, lost whole, is submitted again at ``at`` as ``next``
    pipeline/RUN                   a sealed pipeline run: {"jobs": {NAME: ID}, "after", "at", "pipeline", "notify"};
                                   its jobs' entries name it
    notrun/ID                      job ID ended without running, for a job it ran after: {"reason"}
    notified/RUN                   {"at"}: a keeper took the sending of run RUN's notification (it has ended)
    keeper                         the keeper's heartbeat: {"at", "version"}
    aside/ORDER                    {"sent", "since"}: a keeper first stepped aside for order ORDER of other code

A slot is taken by writing the generation after the one just read, and only if that key is absent,
which the store does atomically; a claim that finds a newer generation of its slot after writing
withdraws (a claimer that paused long enough may write a generation that was cleaned up). So of any
number of claimers racing for a slot, one holds it. A slot whose holder ended without saying so
(killed with its node) is free again as soon as Ray's job table says the job ended, and one whose
holder Ray does not know at all (deleted, or never submitted because its keeper died) once
:data:`UNKNOWN_HOLDER_GRACE_S` have passed by the head's clock. Order is priority (higher first),
then the time Ray took the submission, and only the first job in order may take a slot: a large
job is never overtaken by smaller ones behind it. What the jobs holding slots declared they need is
counted as taken until Ray shows it placed for them: a job that places its workers late (setting up
its environment, importing) never makes room for the next one.

Standard library only, but for the GCS client, which is given (``GcsKeyValue``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from ..queueing import (MOST_STEP_ASIDES, NAMESPACE, STEP_ASIDE_WINDOW_S, TERMINAL,
                        TOO_MANY_STEP_ASIDES, UNPLACEABLE_ORDER, awaits_next_attempt, checked_queue_name, entered_job,
                        is_order, never_placed)
from ..wire import METADATA_ENQUEUES, METADATA_PRIORITY, METADATA_QUEUED_ID, METADATA_SPEC_HASH

# Ray's job manager keeps each submission's record here (ray.dashboard.modules.job.common.JobInfoStorageClient).
RAY_JOB_NAMESPACE = b"job"

RAY_JOB_INFO_PREFIX = "_ray_internal_job_info_"

# An order job that ended this long ago is deleted by the keeper, so that Ray's job list shows the team's jobs.
HELPER_KEPT_S = 30.0

# An order to enter a job whose job never reached Ray's table (its stand-in could not be submitted) is deleted
# after this long: only then may the id be entered again.
ORPHAN_ORDER_KEPT_S = 600.0

# A waiting job's packages are pinned for this long (and again by the keeper while it waits).
PIN_FOR_S = 600
# A slot whose holder Ray does not know frees after this long: the keeper writes a claim before it submits.
UNKNOWN_HOLDER_GRACE_S = 30.0

# An enqueue still on its way (its order running as a helper job, its entry not yet written) holds back a job
# behind it in order for at most this long: a helper that never ran does not block its queue for good.
ENQUEUE_IN_FLIGHT_S = 60.0

# When a keeper first stepped aside for an order of other code, by the order's id (``stepped_aside_since``).
STEPPED_ASIDE_PREFIX = "aside/"

# How far ahead of the head's clock an order's sending time may lie and still be believed (clocks that disagree).
ORDER_CLOCK_SKEW_S = 300.0

# A job lost whole keeps its slot this long after it ended while the keeper (which looks every few seconds) has not
# decided about it: a keeper that never does (down, or blind to that job) holds up its queue no longer.
LOST_UNDECIDED_HOLD_S = 30.0

# The orders of other code keepers first stepped aside for lately ({order id: when}), to bound how often.
STEP_ASIDE_LOG_KEY = "aside-log"


class KeyValue(Protocol):
    """The cluster's key-value store, as the queue uses it."""

    def get(self, key: str, namespace: bytes = NAMESPACE) -> bytes | None: ...

    def put(self, key: str, value: bytes, *, only_if_absent: bool = False) -> bool: ...

    def delete(self, key: str) -> None: ...

    def keys(self, prefix: str, namespace: bytes = NAMESPACE) -> list[str]: ...

    def multi_get(self, keys: list[str], namespace: bytes = NAMESPACE) -> dict[str, bytes]: ...

    def free_resources(self) -> dict[str, float]: ...

    def placed_resources(self, job_ids: list[str]) -> dict[str, dict[str, float]]: ...

    def alive_nodes(self) -> set[str]: ...

class GcsKeyValue:
    """:class:`KeyValue` over the GCS of the cluster at ``address`` (no ``ray.init``: a helper job is no driver)."""

    def __init__(self, address: str) -> None:
        # Imported here: ray_internals loads Ray Train's callback interfaces, seconds that the keeper of a
        # job's record (every job) must not spend before its entrypoint starts.
        from ..ray_internals import gcs_client

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
        from ..ray_internals import free_resources

        return free_resources(self.client)

    def placed_resources(self, job_ids: list[str]) -> dict[str, dict[str, float]]:
        """What Ray has placed for each of the submissions ``job_ids`` (in a process connected to the cluster)."""
        from ..ray_internals import placed_resources

        return placed_resources(self.client, job_ids)

    def alive_nodes(self) -> set[str]:
        """The ids (hex) of the cluster's live nodes."""
        from ..ray_internals import alive_nodes

        return alive_nodes(self.client)

    def pin_package(self, uri: str, expiration_s: int) -> None:
        """Keep a ``gcs://`` package of a waiting job for ``expiration_s`` more: Ray deletes one no job references."""
        self.client.pin_runtime_env_uri(uri, expiration_s)

@dataclass
class Slot:
    """One slot of a queue as last read: its newest generation, and who holds it (None: free)."""

    index: int
    generation: int
    holder: dict[str, Any] | None = None

def limits(store: KeyValue, queue: str) -> dict[str, Any]:
    """The queue's limits on the cluster: ``max_running`` (jobs at once) and ``quota`` (resource name -> the most
    its running jobs hold together); either may be absent."""
    raw = store.get(f"limits/{queue}")
    return json.loads(raw) if raw else {}

def max_running(store: KeyValue, queue: str) -> int | None:
    """The queue's limit on jobs running at once (None: no limit set on the cluster)."""
    value = limits(store, queue).get("max_running")
    return int(value) if value is not None else None

def quota(store: KeyValue, queue: str) -> dict[str, float]:
    """The queue's quota: resource name -> the most its running jobs may hold together (empty: none)."""
    return {str(name): float(amount) for name, amount in (limits(store, queue).get("quota") or {}).items()}

def set_limits(store: KeyValue, queue: str, max_running_jobs: int | None,
               quota_given: Mapping[str, float] | None = None) -> None:
    """Change the queue's limits on the cluster: what is given replaces its old value, the rest is kept; neither
    given removes every limit."""
    if max_running_jobs is None and not quota_given:
        store.delete(f"limits/{queue}")
        return
    found = limits(store, queue)
    if max_running_jobs is not None:
        found["max_running"] = int(max_running_jobs)
    if quota_given:
        found["quota"] = {**(found.get("quota") or {}), **{str(name): float(amount)
                                                           for name, amount in quota_given.items()}}
    store.put(f"limits/{queue}", json.dumps(found).encode())

def set_order(store: KeyValue, order: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
    """Carry out a client's order to change a queue's limits (``queue``, ``max_running``, ``quota``), whoever reads
    it: the keeper, or the order's own job when no keeper was alive; the queue as it is then."""
    queue = checked_queue_name(order["queue"])
    limit = order.get("max_running")
    set_limits(store, queue, None if limit is None else int(limit), order.get("quota") or None)
    return describe(store, now, queue)

def quota_use(holders: Mapping[int, Mapping[str, Any]]) -> dict[str, float]:
    """What the jobs holding a queue's slots hold together, by what each was let in with (its grant included)."""
    used: dict[str, float] = {}
    for holder in holders.values():
        for name, amount in (holder.get("needs") or {}).items():
            used[name] = used.get(name, 0.0) + float(amount)
    return used

def over_quota(queue: str, needs: Mapping[str, float], used: Mapping[str, float],
               limit: Mapping[str, float]) -> str:
    """Why a job needing ``needs`` may not start now in ``queue`` by its quota ("" when it may)."""
    for name, most in sorted(limit.items()):
        wanted = float(needs.get(name, 0.0))
        if wanted and used.get(name, 0.0) + wanted > most + 1e-9:
            return (f"queue {queue} holds {used.get(name, 0.0):g} of its {most:g} {name}, and this job needs "
                    f"{wanted:g} more")
    return ""

def order_to_step_aside_for(store: KeyValue, pending: list[Mapping[str, Any]], other_code: Mapping[str, Any],
                            now: float) -> tuple[str | None, str]:
    """The order of other code (``other_code``: their ids, among Ray's records ``pending``) that a keeper steps aside
    for, so that it starts a keeper of its own code, and why the others are refused. None when there is none: each
    could never be placed (every keeper after would step aside for it in turn), or keepers stepped aside for
    :data:`MOST_STEP_ASIDES` other orders within :data:`STEP_ASIDE_WINDOW_S` already."""
    infos = {info["submission_id"]: info for info in pending if info["submission_id"] in other_code}
    sent = {order_id: float(info.get("start_time") or 0) / 1000 for order_id, info in infos.items()}
    recent = _recent_step_asides(store, now)
    for order_id, since in stepped_aside_since(store, sent, now).items():
        if never_placed(infos[order_id], now - since):
            continue
        if order_id not in recent:
            if len(recent) >= MOST_STEP_ASIDES:
                return None, TOO_MANY_STEP_ASIDES
            store.put(STEP_ASIDE_LOG_KEY, json.dumps({**recent, order_id: now}).encode())
        return order_id, UNPLACEABLE_ORDER
    return None, UNPLACEABLE_ORDER


def _recent_step_asides(store: KeyValue, now: float) -> dict[str, float]:
    """The orders keepers first stepped aside for within the window before ``now`` (what another hand wrote there,
    or a time ahead of ``now``, counts as now: it is not let open the bound)."""
    try:
        kept = json.loads(store.get(STEP_ASIDE_LOG_KEY) or b"{}")
    except ValueError:
        kept = {}
    recent = {}
    for order_id, when in (kept.items() if isinstance(kept, dict) else []):
        try:
            when = min(float(when), now) if isinstance(when, (int, float)) and not isinstance(when, bool) else now
        except OverflowError:  # an integer no float holds
            when = now
        if now - when < STEP_ASIDE_WINDOW_S:
            recent[str(order_id)] = when
    return recent


def stepped_aside_since(store: KeyValue, other_code: Mapping[str, float], now: float) -> dict[str, float]:
    """When a keeper first stepped aside for each order of other code in ``other_code`` (order id -> when Ray took
    it, by the head's clock): ``now`` for one no keeper has. The order's time to be placed counts from then, not from
    when it was sent, for it may have been sent while a helper or a keeper being replaced held the head. A time kept
    for an earlier order of the same id, or one no keeper writes for this one (:func:`_kept_aside`: written by
    another hand, or by a clock that stepped back), is replaced; what was kept of orders that wait no more is
    forgotten."""
    for key in store.keys(STEPPED_ASIDE_PREFIX):
        if key[len(STEPPED_ASIDE_PREFIX):] not in other_code:
            store.delete(key)
    since = {}
    for order_id, sent in other_code.items():
        key = f"{STEPPED_ASIDE_PREFIX}{order_id}"
        kept = _kept_aside(store.get(key), sent, now)
        if kept is None:
            kept = _aside_horizon(sent, now)
            store.put(key, json.dumps({"sent": sent, "since": kept}).encode())
        since[order_id] = kept
    return since


def _aside_horizon(sent: float, now: float) -> float:
    """The latest time an order sent at ``sent`` can have been stepped aside for, by the head's clock ``now``: a head
    clock a little behind Ray's sending time counts from the sending; a sending time far ahead of it (a forged
    record, a clock that jumped) counts from now, so that the order's time to be placed runs out all the same."""
    return max(now, sent) if sent <= now + ORDER_CLOCK_SKEW_S else now


def _kept_aside(raw: bytes | None, sent: float, now: float) -> float | None:
    """The time kept under an ``aside/`` key, when it was kept for the order sent at ``sent`` and is a time a keeper
    writes (:func:`_aside_horizon`: the sending or later, or a present well before a sending far ahead) no later than
    the horizon now (None: it was not)."""
    try:
        kept = json.loads(raw) if raw else None
        since = float(kept["since"])
        # A time kept while the sending lay far ahead stays kept once the clock comes within the skew of it: replaced
        # then by the sending time, the order would be stepped aside for that much longer.
        after_sending = sent <= since or since < sent - ORDER_CLOCK_SKEW_S
        return since if float(kept["sent"]) == sent and after_sending and since <= _aside_horizon(sent, now) else None
    except (ValueError, TypeError, KeyError, OverflowError):
        return None


def ray_job_info(store: KeyValue, job_id: str) -> dict[str, Any] | None:
    """The record Ray's job manager keeps of submission ``job_id`` (None when it has none)."""
    raw = store.get(RAY_JOB_INFO_PREFIX + job_id, namespace=RAY_JOB_NAMESPACE)
    return job_info_from(raw) if raw else None

def job_info_from(raw: bytes) -> dict[str, Any]:
    """One record of Ray's job table as its job API shows it: the ``runtime_env`` it keeps as a JSON string, read."""
    info = json.loads(raw)
    if "runtime_env" not in info:
        try:
            info["runtime_env"] = json.loads(info.get("runtime_env_json") or "{}") or {}
        except ValueError:
            info["runtime_env"] = {}
    return info

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

    A holder is gone when it said so (``done``), when Ray's job table says its job ended (but for a job lost whole
    whose slot waits for its next attempt), or when Ray does not know its job and its claim is older than
    :data:`UNKNOWN_HOLDER_GRACE_S` (``now`` is the head's clock, which wrote ``since`` and Ray's end times).
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
        info = ray_job_info(store, str(holder.get("id")))
        status = str(info.get("status") or "") or None if info else None
        if status in TERMINAL and not _slot_waits_for_next_attempt(store, str(holder.get("id")), info, now):
            continue
        if status is None and now - float(holder.get("since") or 0) > UNKNOWN_HOLDER_GRACE_S:
            continue
        found[index].holder = holder
    return found

def retried_by_keeper(job_id: str, info: Mapping[str, Any]) -> bool:
    """Whether the keeper applies the retry rule of job ``job_id`` (``info``: Ray's record of it) when it is lost
    whole: a job of rayjobs (submitted from a spec), not an order nor a job of other hands."""
    return not is_order(job_id, info) and METADATA_SPEC_HASH in (info.get("metadata") or {})

def _slot_waits_for_next_attempt(store: KeyValue, job_id: str, info: Mapping[str, Any], now: float) -> bool:
    """Whether the slot of job ``job_id``, which ended (``info``: Ray's record of it), waits for the job's next
    attempt: the job was lost whole, and the keeper has not decided yet (for :data:`LOST_UNDECIDED_HOLD_S` after its
    end at most) or has decided to run it again and not yet put that attempt back into its queue (its backoff). The
    attempt goes back to the job's first place; the job behind must not take the slot meanwhile, which it would when
    Ray's job manager ends a lost job before the keeper looks."""
    if not retried_by_keeper(job_id, info) or not awaits_next_attempt(info, None):
        return False
    if store.get(f"lost/{job_id}") is None:
        return now - float(info.get("end_time") or 0) / 1000 <= LOST_UNDECIDED_HOLD_S
    return store.get(f"retry/{job_id}") is not None

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

def not_yet_placed(store: KeyValue, slot_maps: Mapping[str, dict[int, Slot]]) -> dict[str, float]:
    """What the jobs holding slots (``slot_maps``: each queue's slots) declared they need and Ray does not show
    placed for them yet: counted as taken, on top of what Ray shows used, until each job has ended.

    A job places its workers when its code gets there (after its environment is set up and its imports are
    done), so what is free now may already be promised to it.
    """
    holders = [holder for slot_map in slot_maps.values() for holder in held(slot_map).values()]
    if not holders:
        return {}
    placed = store.placed_resources([str(holder.get("id")) for holder in holders])
    pending: dict[str, float] = {}
    for holder in holders:
        shown = placed.get(str(holder.get("id"))) or {}
        for name, amount in (holder.get("needs") or {}).items():
            missing = float(amount) - shown.get(name, 0.0)
            if missing > 0:
                pending[name] = pending.get(name, 0.0) + missing
    return pending

def shortfall(needs: dict[str, float], free: dict[str, float], pending: dict[str, float]) -> str:
    """Why ``needs`` does not fit what is ``free`` less what is ``pending`` ("" when it fits)."""
    for name, amount in sorted(needs.items()):
        available = free.get(name, 0.0) - pending.get(name, 0.0)
        if amount > available + 1e-9:
            unit = f"{name}s" if name in ("CPU", "GPU") and amount != 1 else name
            return f"needs {amount:g} {unit}, {max(available, 0):g} free"
    return ""

def ray_jobs(store: KeyValue, prefix: str = "") -> list[dict[str, Any]]:
    """Every record of Ray's job table (or those whose submission id begins with ``prefix``), in one request."""
    keys = store.keys(RAY_JOB_INFO_PREFIX + prefix, namespace=RAY_JOB_NAMESPACE)
    return [{**job_info_from(raw), "submission_id": key[len(RAY_JOB_INFO_PREFIX):]}
            for key, raw in store.multi_get(keys, namespace=RAY_JOB_NAMESPACE).items()]

def finished_orders(store: KeyValue, now: float) -> list[str]:
    """The order jobs that may leave Ray's table: ended more than :data:`HELPER_KEPT_S` ago (their answer has long
    been read), but an order to enter a job only once that job is in Ray's table (until then it keeps the job's id
    taken), or :data:`ORPHAN_ORDER_KEPT_S` after it ended when the job never got there."""
    jobs = ray_jobs(store)
    known = {info["submission_id"] for info in jobs}
    done = []
    for info in jobs:
        job_id = info["submission_id"]
        if not is_order(job_id, info) or info.get("status") not in TERMINAL:
            continue
        ended_s_ago = now - (info.get("end_time") or 0) / 1000
        if ended_s_ago <= HELPER_KEPT_S:
            continue
        entered = entered_job(job_id)
        if entered is None or entered in known or ended_s_ago > ORPHAN_ORDER_KEPT_S:
            done.append(job_id)
    return done

def enqueues_in_flight(store: KeyValue, queue: str, now: float) -> list[tuple[str, dict[str, Any]]]:
    """Jobs submitted to ``queue`` whose entry is still being written: their orders run as helper jobs (the
    keeper was down when they came) and have not ended.

    Their place is known from Ray's job table (the order's submission time and the metadata it carries), so a
    job submitted a moment ago is not overtaken by one behind it in order while its helper starts.
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
        shown = {"queue": name, "max_running": limit, "running": running, "waiting": listed}
        if (most := quota(store, name)):
            shown.update(quota=most, used=quota_use(holders))
        found.append(shown)
    return found


def enqueue(store: KeyValue, order: dict[str, Any], submitted: float) -> dict[str, Any]:
    """Write a job's entry, once: a job of that id waiting or in Ray's table is answered ``exists``.

    ``submitted``: when Ray took the order (the head's clock), which places the job among those of its priority.
    """
    queue = checked_queue_name(order["queue"])
    job_id = str(order["id"])
    request = order["request"]
    if str(request.get("submission_id")) != job_id:
        raise ValueError(f"the request of job {job_id} names another id, {request.get('submission_id')!r}")
    existing = ray_job_info(store, job_id)
    queued_in = next((key.split("/")[1] for key in store.keys("waiting/") if key.rpartition("/")[2] == job_id), None)
    if existing is not None or queued_in is not None:
        metadata = (existing or {}).get("metadata") or json.loads(store.get(f"request/{job_id}") or b"{}").get(
            "metadata") or {}
        return {"exists": "ray" if existing is not None else "queue", "status": (existing or {}).get("status"),
                "queue": queued_in, "metadata": metadata}
    entry = {"name": order.get("name"), "priority": int(order.get("priority") or 0), "submitted": submitted,
             "spec_hash": (request.get("metadata") or {}).get(METADATA_SPEC_HASH),
             "needs": order.get("needs") or {}, "grows": list(order.get("grows") or []),
             "packages": order.get("packages") or [],
             "agent_modules": order.get("agent_modules") or []}
    if order.get("pipeline"):
        # A job of a pipeline run: it lines up once the run is sealed and every job it runs after has SUCCEEDED.
        entry.update(pipeline=str(order["pipeline"]), pipeline_job=order.get("pipeline_job"),
                     after=[str(other) for other in order.get("after") or []])
    store.put(f"request/{job_id}", json.dumps(request).encode())
    if not store.put(f"waiting/{queue}/{job_id}", json.dumps(entry).encode(), only_if_absent=True):
        return {"exists": "queue", "queue": queue, "metadata": request.get("metadata") or {}}
    pin = getattr(store, "pin_package", None)
    for uri in entry["packages"] if pin is not None else []:
        pin(uri, PIN_FOR_S)
    order_now = [other for other, _ in waiting(store, queue)]
    return {"queued": queue, "position": order_now.index(job_id) + 1 if job_id in order_now else 0,
            "waiting": len(order_now), "running": len(held(slots(store, queue, submitted))),
            "max_running": max_running(store, queue)}


def note_attempt(store: KeyValue, job_id: str, attempt: int) -> None:
    """Say that job ``job_id``'s wrapper started attempt ``attempt`` in place: a keeper that finds the job lost whole
    counts its attempts from there."""
    store.put(f"attempts/{job_id}", json.dumps({"attempt": attempt}).encode())


def noted_attempt(store: KeyValue, job_id: str) -> int | None:
    """The attempt job ``job_id``'s wrapper said it started last (None: it said none)."""
    raw = store.get(f"attempts/{job_id}")
    try:
        return int(json.loads(raw)["attempt"]) if raw else None
    except (ValueError, TypeError, KeyError):
        return None
