"""The queue's keeper: one small detached actor per cluster that submits each waiting job when its turn comes.

It runs on the head node (so that the head's clock is the one clock of the queue) and holds no state
of its own that matters: every waiting job, slot and limit is in the key-value store
(``queueing.py``), so a keeper that dies is restarted by Ray (``max_restarts=-1``) and picks up where
it was. It is started by the first helper job that needs it and replaced by one whose code differs.

It lists the store's keys every ``TICK_S`` (one request) and takes a step when they changed, or every
``STEP_EVERY_S`` while anything waits. Each step:

1. A stop asked for a waiting job takes it out of its queue, and the keeper submits in its place a
   light stand-in under the same id, which writes its run record, notification and log line ("stopped
   while it waited") and then has Ray stop it: the job reads as STOPPED wherever a job is read.
2. The first job of each queue (by priority, then submission) is submitted to Ray if its queue runs
   fewer jobs than its limit and the cluster has free what it needs; a job whose request Ray
   refuses ends FAILED through the same stand-in, with Ray's reason.
3. What it found is written to ``rayjobs-queue.json`` in the head's Ray log folder, which clients
   read through Ray's own log API: ``rayjobs queue``, ``status`` and ``list`` ask no process anything.

The ``gcs://`` packages a waiting job's request names are pinned again while it waits: Ray deletes a
package no job references after ten minutes, and a waiting job is no Ray job yet.

A helper job (``helper``) writes a job's entry when it is submitted, asks for a stop, or sets a
limit: the store is reachable from inside the cluster only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping, Protocol

from .pinning import ADDRESS_VARIABLE
from .wire import OWN_LINE_PREFIX, METADATA_SPEC_HASH, RECORD_COMMAND
from .queueing import (ADMISSION_ENV_VAR, NAMESPACE, Admission, GcsKeyValue, KeyValue, Slot,
                       admitted_recently, agent_version, answer, checked_queue_name, claim, describe,
                       enqueues_in_flight, finished_helpers, free_slot, held, max_running, order_from, order_key,
                       queues_in,
                       ray_job_info,
                       release, set_limits, shortfall, slots, submission_id_from, waiting)

KEEPER_NAME = "rayjobs-queue-keeper"
# What runs a helper job: a constant command, its order in its variables (``queueing.order_variables``).
HELPER_ENTRYPOINT = "python -m rayjobs_agent.queue_keeper"
KEEPER_NAMESPACE = "rayjobs"
SNAPSHOT_FILE = "rayjobs-queue.json"
# How often the keeper lists the store's keys: one request, and a step only when they changed (a slot given
# back, a job entered, a stop asked) or every STEP_EVERY_S (a job that ended without giving its slot back,
# resources freed elsewhere), IDLE_STEP_EVERY_S when nothing waits. While nothing waits it looks every
# IDLE_TICK_S: an idle keeper costs the head next to nothing, and a job entered then waits a second at most.
TICK_S = 0.1
IDLE_TICK_S = 1.0
STEP_EVERY_S = 1.0
IDLE_STEP_EVERY_S = 2.0
# The heartbeat a helper job trusts: a keeper that wrote none for this long is looked for (and started).
BEAT_S = 2.0
BEAT_FRESH_S = 10.0
# Written at least this often even when nothing changed, so that a reader can tell a live keeper.
SNAPSHOT_EVERY_S = 5.0
# A waiting job's packages are pinned for this long, again every PIN_EVERY_S.
PIN_FOR_S = 600
PIN_EVERY_S = 120.0
# Finished helper jobs are looked for this often.
CLEAN_EVERY_S = 10.0
# After Ray refused a request for a reason that may pass (no answer, a server error), the keeper waits
# this long before it tries the same job again.
RETRY_SUBMIT_S = 5.0


class Refused(Exception):
    """Ray refused a job request for good (a malformed request, an id taken by another job)."""


class AlreadySubmitted(Exception):
    """Ray already has a job of this id: the keeper submitted it before it died, and then its entry stayed."""


class RayJobs(Protocol):
    """What the keeper asks of Ray's job API."""

    def submit(self, request: dict[str, Any]) -> None: ...

    def stop(self, job_id: str) -> bool: ...

    def delete(self, job_id: str) -> None: ...


class DashboardJobs:
    """:class:`RayJobs` through the job API of the dashboard on this cluster (its address is in the GCS)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._client: Any = None

    def _job_client(self) -> Any:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            from .ray_internals import dashboard_address

            # The client adds the cluster's token itself when the cluster uses token authentication.
            self._client = JobSubmissionClient("http://" + dashboard_address(self.store.client))
        return self._client

    def submit(self, request: dict[str, Any]) -> None:
        """Submit ``request`` (the JSON body ``JobSubmissionClient`` sends), with its own submission id."""
        try:
            self._job_client().submit_job(**request)
        except RuntimeError as exc:
            text = str(exc)
            if "status code 400" in text:
                if "already exists" in text:
                    raise AlreadySubmitted(request["submission_id"]) from None
                raise Refused(_last_line(text)) from None
            self._client = None  # a fresh client next time: the dashboard may have restarted
            raise

    def stop(self, job_id: str) -> bool:
        """Ask Ray to stop a job; False when it had ended or is unknown."""
        try:
            return bool(self._job_client().stop_job(job_id))
        except RuntimeError:
            return False

    def delete(self, job_id: str) -> None:
        """Delete a finished job from Ray's table."""
        self._job_client().delete_job(job_id)


def with_admission(request: dict[str, Any], admission: Admission) -> dict[str, Any]:
    """``request`` with ``admission`` in its variables, for the job's wrapper."""
    runtime_env = dict(request.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), ADMISSION_ENV_VAR: admission.to_json()}
    return {**request, "runtime_env": runtime_env}


def stand_in(request: dict[str, Any], entry: Mapping[str, Any], admission: Admission) -> dict[str, Any]:
    """A light request under the job's id that ends as ``admission.outcome`` says, without running the job.

    It keeps the job's metadata, variables and the agent's package (its wrapper writes the record and
    sends the notification), and drops its code, its environment to build and its resources: it must
    start at once whatever the cluster holds.
    """
    runtime_env = request.get("runtime_env") or {}
    light: dict[str, Any] = {"env_vars": dict(runtime_env.get("env_vars") or {})}
    if entry.get("agent_modules"):
        light["py_modules"] = list(entry["agent_modules"])
    kept = {key: request[key] for key in ("entrypoint", "submission_id", "metadata") if key in request}
    if not str(kept.get("entrypoint") or "").startswith(RECORD_COMMAND):
        kept["entrypoint"] = f"{RECORD_COMMAND} true"  # the wrapper alone reads the outcome: never the job's own command
    return with_admission({**kept, "runtime_env": light}, admission)


class Keeper:
    """The keeper's work, one :meth:`step` at a time, over a store and Ray's job API (both seams for tests)."""

    def __init__(self, store: KeyValue, jobs: RayJobs, *, clock: Callable[[], float] = time.time,
                 say: Callable[[str], None] = print, pause: Callable[[], None] | None = None) -> None:
        self.store = store
        self.jobs = jobs
        self.clock = clock
        self.say = say
        self.pause = pause  # tests: called inside each slot claim, between its write and its check
        self.version = agent_version()
        self.started = clock()
        self._beat_at = 0.0
        self._pinned_at = 0.0
        self._cleaned_at = 0.0
        self._keys_after_step: list[str] | None = None
        self._retry_at: dict[str, float] = {}

    def step(self) -> dict[str, Any]:
        """Handle stops, admit what may start, and return what the queue looks like now (the snapshot)."""
        now = self.clock()
        if now - self._beat_at >= BEAT_S:
            self.store.put("keeper", json.dumps({"at": now, "version": self.version}).encode())
            self._beat_at = now
        self._handle_stops(now)
        reasons: dict[str, str] = {}
        for queue in queues_in(self.store):
            reasons.update(self._admit(queue, now))
        if now - self._pinned_at >= PIN_EVERY_S:
            self._pin_packages()
            self._pinned_at = now
        if now - self._cleaned_at >= CLEAN_EVERY_S:
            self._cleaned_at = now
            for job_id in finished_helpers(self.store, now):
                self.jobs.delete(job_id)
        return {"at": now, "keeper": {"version": self.version, "started": self.started},
                "queues": describe(self.store, now, reasons=reasons)}

    def step_due(self, keys: list[str], since_step_s: float) -> bool:
        """Whether a step is due, given the store's keys now and the time since the last step."""
        if keys != self._keys_after_step:
            return True
        waits = any(key.startswith(("waiting/", "stop/")) for key in keys)
        return since_step_s >= (STEP_EVERY_S if waits else IDLE_STEP_EVERY_S)

    def waits(self) -> bool:
        """Whether any job waited or any stop was asked at the last step (the keeper then looks often)."""
        return any(key.startswith(("waiting/", "stop/")) for key in self._keys_after_step or ())

    def note_keys_after_step(self) -> list[str]:
        """The store's keys once a step has changed them (its own writes are no reason for another)."""
        self._keys_after_step = self.store.keys("")
        return self._keys_after_step

    def _handle_stops(self, now: float) -> None:
        for key in self.store.keys("stop/"):
            job_id = key.partition("/")[2]
            entry_key = next((found for found in self.store.keys("waiting/") if found.rpartition("/")[2] == job_id),
                             None)
            if entry_key is None:
                # Admitted meanwhile (or unknown): a running job is stopped by Ray itself.
                self.jobs.stop(job_id)
            else:
                queue = entry_key.split("/")[1]
                entry = json.loads(self.store.get(entry_key) or b"{}")
                position = next((index for index, (other, _) in enumerate(waiting(self.store, queue), start=1)
                                 if other == job_id), 0)
                # Its stand-in asks Ray for the stop itself, once its record and notification are out.
                self._end_without_running(queue, job_id, entry, Admission(
                    queue, waited_s=now - float(entry.get("submitted") or now), position=position,
                    outcome="STOPPED", reason=f"stopped while it waited in queue {queue} (position {position})"))
            self.store.delete(key)

    def _admit(self, queue: str, now: float) -> dict[str, str]:
        """Submit the first jobs of ``queue`` while they may start; why the first one left waits (by id)."""
        while True:
            entries = waiting(self.store, queue)
            if not entries:
                return {}
            job_id, entry = entries[0]
            reason = self._why_not_now(queue, job_id, entry, now)
            if reason:
                return {job_id: reason}
            slot_map = slots(self.store, queue, now)
            slot = free_slot(slot_map, max_running(self.store, queue))
            assert slot is not None  # _why_not_now read the same limit
            holder = {"id": job_id, "name": entry.get("name"), "since": now, "needs": entry.get("needs") or {}}
            generation = claim(self.store, queue, slot, holder, self.pause)
            if generation is None:
                return {job_id: f"another admission took slot {slot.index} of queue {queue} first"}
            admission = Admission(queue, slot.index, generation, waited_s=now - float(entry.get("submitted") or now),
                                  position=1, admitted_at=self.clock())
            if not self._submit(queue, job_id, entry, admission, slot):
                return {job_id: f"Ray did not take its request yet; trying again in {RETRY_SUBMIT_S:g}s"}

    def _why_not_now(self, queue: str, job_id: str, entry: dict[str, Any], now: float) -> str:
        if now < self._retry_at.get(job_id, 0.0):
            return f"Ray did not take its request; trying again in {self._retry_at[job_id] - now:.0f}s"
        limit = max_running(self.store, queue)
        running = len(held(slots(self.store, queue, now)))
        if limit is not None and running >= limit:
            return f"{running} of {limit} running in queue {queue}"
        short = shortfall(entry.get("needs") or {}, self.store.free_resources(), admitted_recently(self.store, now))
        if short:
            return short
        mine = order_key(job_id, entry)
        earlier = [other for other, place in enqueues_in_flight(self.store, queue, now)
                   if other != job_id and order_key(other, place) < mine]
        if earlier:
            return f"{earlier[0]}, submitted just before it, is still being queued"
        return ""

    def _submit(self, queue: str, job_id: str, entry: dict[str, Any], admission: Admission, slot: Slot) -> bool:
        """Submit an admitted job; False when Ray could not take it now (its slot is given back, it stays first)."""
        request = json.loads(self.store.get(f"request/{job_id}") or b"null")
        try:
            if request is None:
                raise Refused("its job request is missing from the queue's store")
            self.jobs.submit(with_admission(request, admission))
        except AlreadySubmitted:
            pass
        except Refused as exc:
            release(self.store, queue, slot.index, admission.generation)
            self.say(f"queue {queue}: Ray refused job {job_id}: {exc}")
            self._end_without_running(queue, job_id, entry, Admission(
                queue, waited_s=admission.waited_s, position=1, outcome="FAILED",
                reason=f"Ray refused its request when its turn in queue {queue} came: {exc}"), request or {})
            return True
        except Exception as exc:  # noqa: BLE001 - the dashboard may be restarting: the job keeps its place
            release(self.store, queue, slot.index, admission.generation)
            self._retry_at[job_id] = self.clock() + RETRY_SUBMIT_S
            self.say(f"queue {queue}: could not submit job {job_id} ({type(exc).__name__}: {_last_line(str(exc))}); "
                     f"trying again in {RETRY_SUBMIT_S:g}s")
            return False
        self._forget(queue, job_id)
        self.say(f"queue {queue}: started job {job_id} in slot {slot.index} after {admission.waited_s:.1f}s")
        return True

    def _end_without_running(self, queue: str, job_id: str, entry: dict[str, Any], admission: Admission,
                             request: dict[str, Any] | None = None) -> None:
        request = request if request is not None else json.loads(self.store.get(f"request/{job_id}") or b"{}")
        self._forget(queue, job_id)
        if not request:
            return
        try:
            self.jobs.submit(stand_in(request, entry, admission))
        except AlreadySubmitted:
            pass
        except Exception as exc:  # noqa: BLE001 - the entry is gone either way; say why it left no trace
            self.say(f"queue {queue}: job {job_id} {admission.outcome}, but its stand-in could not be submitted "
                     f"({type(exc).__name__}: {_last_line(str(exc))})")

    def _forget(self, queue: str, job_id: str) -> None:
        self.store.delete(f"waiting/{queue}/{job_id}")
        self.store.delete(f"request/{job_id}")
        self._retry_at.pop(job_id, None)

    def _pin_packages(self) -> None:
        pin = getattr(self.store, "pin_package", None)
        if pin is None:
            return
        for raw in self.store.multi_get(self.store.keys("waiting/")).values():
            for uri in json.loads(raw).get("packages") or []:
                try:
                    pin(uri, PIN_FOR_S)
                except Exception as exc:  # noqa: BLE001 - the next round tries again
                    self.say(f"could not keep package {uri} of a waiting job: {exc}")


class KeeperActor:
    """The detached actor around :class:`Keeper`: its loop runs in a thread, its snapshot goes to the head's log folder."""

    def __init__(self) -> None:
        import ray

        from .ray_internals import logs_dir

        self.store = GcsKeyValue(ray.get_runtime_context().gcs_address)
        self.keeper = Keeper(self.store, DashboardJobs(self.store), say=_say)
        self.snapshot_path = os.path.join(logs_dir(), SNAPSHOT_FILE)
        self._thread = threading.Thread(target=self._loop, name="rayjobs-queue-keeper", daemon=True)
        self._thread.start()

    def version(self) -> str:
        """The code this keeper runs (``queueing.agent_version``)."""
        return self.keeper.version

    def _loop(self) -> None:
        last_problem = ""
        written, written_at = "", 0.0
        stepped_at = 0.0
        waits = True
        while True:
            try:
                if self.keeper.step_due(self.store.keys(""), time.monotonic() - stepped_at):
                    stepped_at = time.monotonic()
                    snapshot = self.keeper.step()
                    body = json.dumps({key: value for key, value in snapshot.items() if key != "at"}, sort_keys=True)
                    if body != written or time.time() - written_at >= SNAPSHOT_EVERY_S:
                        _write_atomically(self.snapshot_path, json.dumps(snapshot, sort_keys=True))
                        written, written_at = body, time.time()
                        # What the snapshot holds was read after this moment: a helper waits for it (enqueue).
                        self.store.put("published", json.dumps({"read_from": snapshot["at"]}).encode())
                    self.keeper.note_keys_after_step()
                last_problem = ""
                waits = self.keeper.waits()
            except Exception as exc:  # noqa: BLE001 - a store error now and then must not end the queue
                problem = f"{type(exc).__name__}: {_last_line(str(exc))}"
                if problem != last_problem:
                    _say(f"queue keeper: {problem}; trying again")
                last_problem = problem
            time.sleep(TICK_S if waits else IDLE_TICK_S)


def _say(text: str) -> None:
    print(f"{OWN_LINE_PREFIX}{text}", flush=True)


def _write_atomically(path: str, text: str) -> None:
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as handle:
        handle.write(text + "\n")
    os.replace(partial, path)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no details"


def keeper_is_current(store: KeyValue, now: float) -> bool:
    """Whether a keeper of this code wrote its heartbeat lately."""
    raw = store.get("keeper")
    beat = json.loads(raw) if raw else {}
    return beat.get("version") == agent_version() and now - float(beat.get("at") or 0) < BEAT_FRESH_S


def ensure_keeper(store: KeyValue, now: float) -> None:
    """Start the cluster's keeper unless one of this code beats already (replacing one of other code)."""
    if keeper_is_current(store, now):
        return
    import ray

    ray.init(address="auto", namespace=KEEPER_NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
    try:
        try:
            existing = ray.get_actor(KEEPER_NAME)
        except ValueError:
            existing = None
        if existing is not None:
            try:
                if ray.get(existing.version.remote(), timeout=30) == agent_version():
                    return
            except Exception:  # noqa: BLE001 - one that does not answer is replaced like one of other code
                pass
            ray.kill(existing, no_restart=True)
            _wait_until_gone(ray)
        modules = (ray.get_runtime_context().runtime_env or {}).get("py_modules") or []
        keeper = ray.remote(KeeperActor).options(
            name=KEEPER_NAME, lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=-1,
            resources={"node:__internal_head__": 0.001}, runtime_env={"py_modules": list(modules)}).remote()
        ray.get(keeper.version.remote(), timeout=120)
    finally:
        ray.shutdown()


def _wait_until_gone(ray: Any) -> None:
    for _ in range(100):
        try:
            ray.get_actor(KEEPER_NAME)
        except ValueError:
            return
        time.sleep(0.1)


def _until_published(store: KeyValue, written_at: float, within_s: float = 10.0,
                     sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait until the keeper has published what it read after ``written_at`` (head clock), for ``within_s`` at most:
    a job that ``rayjobs submit`` said is queued is then in what ``status``, ``list`` and ``queue`` read."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        raw = store.get("published")
        if raw and float(json.loads(raw).get("read_from") or 0) > written_at:
            return
        sleep(TICK_S)


def helper(environ: Mapping[str, str]) -> int:
    """What a helper job does: its order (``queueing.order_from``) is a JSON object with ``verb``.

    ``enqueue`` (``queue``, ``id``, ``name``, ``priority``, ``needs``, ``request``, ``packages``,
    ``agent_modules``), ``stop`` (``id``) or ``set`` (``queue``, ``max_running``). Nothing of it reaches a
    shell: the helper's entrypoint is a constant command.
    """
    order = order_from(environ)
    store = GcsKeyValue(environ[ADDRESS_VARIABLE])
    now = time.time()
    verb = order.get("verb")
    if verb == "enqueue":
        answer(enqueue(store, order, environ, now))
    elif verb == "stop":
        job_id = str(order["id"])
        store.put(f"stop/{job_id}", json.dumps({"at": now}).encode())
        ensure_keeper(store, now)
        answer({"stopping": job_id})
    elif verb == "set":
        queue = checked_queue_name(order["queue"])
        limit = order.get("max_running")
        set_limits(store, queue, None if limit is None else int(limit))
        ensure_keeper(store, now)
        answer(describe(store, now, queue))
    else:
        answer({"error": f"unknown order {verb!r}"})
        return 2
    return 0


def enqueue(store: KeyValue, order: dict[str, Any], environ: Mapping[str, str], now: float) -> dict[str, Any]:
    """Write a job's entry (once: a job of that id, waiting or in Ray's table, is answered ``exists``)."""
    queue = checked_queue_name(order["queue"])
    job_id = str(order["id"])
    request = order["request"]
    existing = ray_job_info(store, job_id)
    queued_in = next((key.split("/")[1] for key in store.keys("waiting/") if key.rpartition("/")[2] == job_id), None)
    if existing is not None or queued_in is not None:
        metadata = (existing or {}).get("metadata") or json.loads(store.get(f"request/{job_id}") or b"{}").get(
            "metadata") or {}
        return {"exists": "ray" if existing is not None else "queue", "status": (existing or {}).get("status"),
                "queue": queued_in, "metadata": metadata}
    ensure_keeper(store, now)
    # The helper's own submission time, by the head's job manager: the same clock as every other entry's.
    helper_info = ray_job_info(store, submission_id_from(environ)) or {}
    submitted = (helper_info.get("start_time") or now * 1000) / 1000
    entry = {"name": order.get("name"), "priority": int(order.get("priority") or 0), "submitted": submitted,
             "spec_hash": (request.get("metadata") or {}).get(METADATA_SPEC_HASH),
             "needs": order.get("needs") or {}, "packages": order.get("packages") or [],
             "agent_modules": order.get("agent_modules") or []}
    store.put(f"request/{job_id}", json.dumps(request).encode())
    if not store.put(f"waiting/{queue}/{job_id}", json.dumps(entry).encode(), only_if_absent=True):
        return {"exists": "queue", "queue": queue, "metadata": request.get("metadata") or {}}
    pin = getattr(store, "pin_package", None)
    for uri in entry["packages"] if pin is not None else []:
        pin(uri, PIN_FOR_S)
    _until_published(store, time.time())
    order_now = [other for other, _ in waiting(store, queue)]
    return {"queued": queue, "position": order_now.index(job_id) + 1 if job_id in order_now else 0,
            "waiting": len(order_now), "running": len(held(slots(store, queue, now))),
            "max_running": max_running(store, queue)}


def main() -> int:
    """A helper job's work on the cluster (its order in its variables): enter a job, ask for a stop, set a limit.

    ``rayjobs`` runs these as small jobs on the head node, so that they work wherever a job can be
    submitted (the cluster's key-value store is not reachable from outside it on most clusters).
    """
    try:
        return helper(os.environ)
    except Exception as exc:  # noqa: BLE001 - one paragraph for the client, never a traceback of ours
        answer({"error": f"{type(exc).__name__}: {exc}"})
        return 1


__all__ = ["KEEPER_NAME", "KEEPER_NAMESPACE", "NAMESPACE", "SNAPSHOT_FILE", "AlreadySubmitted", "DashboardJobs",
           "Keeper", "KeeperActor", "Refused", "enqueue", "ensure_keeper", "helper", "stand_in", "with_admission"]


if __name__ == "__main__":
    sys.exit(main())
