"""The queue's keeper: one small detached actor per cluster that carries out the queue's orders, submits each
waiting job when its turn comes, and submits again a job that was lost whole.

It runs on the head node (so that the head's clock is the one clock of the queue) and holds no state
of its own that matters: every waiting job, slot, limit and decided retry is in the key-value store
(``store.py``), so a keeper that dies is restarted by Ray (``max_restarts=-1``) and picks up where
it was. It is started by the first order that finds none alive (which runs as a helper job), and steps
aside for an order of other code, whose helper job then starts a keeper of that code.

Ray runs it as a detached actor (``actor.py``), which lists the store's keys and the order jobs in Ray's table
every tick (two requests) and takes a step when either changed, or every ``STEP_EVERY_S`` while anything waits.
Each step:

1. The order jobs waiting in Ray's table are carried out in the order Ray took them (enter a job, stop
   one, set a limit), and each is ended STOPPED with the keeper's answer as its message.
2. A stop asked for a waiting job takes it out of its queue, and the keeper submits in its place a
   light stand-in under the same id, which writes its run record, notification and log line ("stopped
   while it waited") and then has Ray stop it: the job reads as STOPPED wherever a job is read.
3. Jobs lost whole are found and submitted again (``lost_jobs.py``).
4. The first job of each queue (by priority, then submission) is submitted to Ray if its queue runs
   fewer jobs than its limit and the cluster has free what it needs (less what the jobs let in before
   it declared and have not placed yet); a job whose request Ray refuses ends FAILED through the same
   stand-in, with Ray's reason.
5. A pipeline run that has ended whole, sealed with notify settings, is told once, from a thread of its own
   (``pipelines.py``): a slow service never holds up the queue.
6. What it found is written to ``rayjobs-queue.json`` in the head's Ray log folder, which clients
   read through Ray's own log API: ``rayjobs queue``, ``status`` and ``list`` ask no process anything.

The ``gcs://`` packages a waiting job's request names are pinned again while it waits: Ray deletes a
package no job references after ten minutes, and a waiting job is no Ray job yet.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Mapping

from ..masking import mask_url_userinfo
from ..notify import send
from ..queueing import (ADMISSION_ENV_VAR, ORDER_FORMAT, ORDER_PREFIX, STOP_FOUND_ENDED, STOP_FOUND_RETRY_DUE,
                        STOP_FOUND_RUNNING, STOP_FOUND_WAITING, TERMINAL, Admission, agent_version,
                        answer_text, order_from, order_problem)
from ..wire import METADATA_AGENT_VERSION, RECORD_COMMAND, wrapper_command
from .lost_jobs import PENDING_GRACE_S, WATCH_EVERY_S, LostJobs
from .pipelines import FAILED as PIPELINE_FAILED
from .pipelines import (UNSEALED_KEPT_S, blocked_by, claim_notification, forget_old_runs, is_sealed, note_not_run,
                        notify_run_end, recent_runs, run_end, runs_to_notify, seal_order)
from .ray_jobs import AlreadySubmitted, RayJobs, Refused, last_line
from .store import (ENQUEUE_IN_FLIGHT_S, PIN_FOR_S, RAY_JOB_INFO_PREFIX, RAY_JOB_NAMESPACE, claim, describe, enqueue,
                    enqueues_in_flight, finished_orders, free_slot, held, KeyValue, max_running,
                    not_yet_placed, order_key, over_quota, queues_in, quota, quota_use, ray_job_info, ray_jobs,
                    order_to_step_aside_for, release, set_order, shortfall, Slot, slots, waiting)

# A step is taken when the store's keys or the order jobs changed (a slot given back, a job entered, an order come),
# or every STEP_EVERY_S (a job that ended without giving its slot back, resources freed elsewhere), IDLE_STEP_EVERY_S
# when nothing waits (``actor.py`` looks for changes every tick).
STEP_EVERY_S = 1.0

IDLE_STEP_EVERY_S = 2.0

# The heartbeat: a keeper that wrote none for ``actor.BEAT_FRESH_S`` is hung or gone, and is replaced.
BEAT_S = 2.0

# A waiting job's packages are pinned again every PIN_EVERY_S (for store.PIN_FOR_S).
PIN_EVERY_S = 120.0

# Whether a pipeline run with notify settings has ended is looked at this often: each look reads the store for every
# job of such runs up to the first still pending, too much for every step of a keeper with large pipelines.
NOTIFY_LOOK_EVERY_S = 5.0

# Finished order jobs are looked for this often.
CLEAN_EVERY_S = 10.0

# The threads that send pipeline runs' notifications are named so (each ends within notify.SEND_BOUND_S).
NOTIFY_THREAD = "rayjobs-pipeline-notify"

# After Ray refused a request for a reason that may pass (no answer, a server error), the keeper waits
# this long before it tries the same job again.
RETRY_SUBMIT_S = 5.0


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
    if wrapper_command(str(kept.get("entrypoint") or "")) is None:
        kept["entrypoint"] = f"{RECORD_COMMAND} true"  # the wrapper alone reads the outcome: never the job's own command
    return with_admission({**kept, "runtime_env": light}, admission)

class StepAside(Exception):
    """An order of other code came: this keeper leaves, so that the order starts a keeper of its own code."""


class Keeper:
    """The keeper's work, one :meth:`step` at a time, over a store and Ray's job API (both seams for tests)."""

    def __init__(self, store: KeyValue, jobs: RayJobs, *, clock: Callable[[], float] = time.time,
                 say: Callable[[str], None] = print, pause: Callable[[], None] | None = None,
                 send_notification: Callable[..., list[dict[str, Any]]] = send) -> None:
        self.store = store
        self.jobs = jobs
        self.clock = clock
        self.say = say
        self.pause = pause  # tests: called inside each slot claim, between its write and its check
        self.send_notification = send_notification  # ``notify.send``'s contract; tests give one that keeps messages
        self._notify_problem = ""
        self.version = agent_version()
        self.started = clock()
        self._beat_at = 0.0
        self._pinned_at = 0.0
        self._cleaned_at = 0.0
        self._watched_at = 0.0
        self.lost = LostJobs(store, jobs, say)
        self._keys_after_step: list[str] | None = None
        self._retry_at: dict[str, float] = {}
        self._admit_problems: dict[str, str] = {}
        self._notify_looked_at = 0.0
        self._sending = threading.Lock()
        self._orders_deferred = False

    def step(self) -> dict[str, Any]:
        """Carry out the orders, handle stops, find lost jobs, admit what may start, and return what the queue
        looks like now (the snapshot).

        Raises:
            StepAside: an order of other code waits; none of the orders was carried out.
        """
        now = self.clock()
        if not self._beat_at:  # a keeper just started counts as working for ``actor.BEAT_FRESH_S``
            self._beat_at = self._beat(now)
        self._take_orders(now)
        self._handle_stops(now)
        if now - self._watched_at >= WATCH_EVERY_S:
            self._watched_at = now
            self.lost.watch(now)
        reasons: dict[str, str] = {}
        # Across queues, the queue whose first job was submitted first goes first: of jobs that fit the cluster, the
        # earlier one is let in, whatever its queue's name.
        for queue in sorted(queues_in(self.store), key=lambda name: self._first_submitted(name)):
            try:
                reasons.update(self._admit(queue, now))
            except Exception as exc:  # noqa: BLE001 - one queue's bad entry must not stop the others, nor the step
                problem = f"{type(exc).__name__}: {last_line(str(exc))}"
                if self._admit_problems.get(queue) != problem:
                    self.say(f"queue {queue}: its jobs could not be looked at ({problem}); the other queues go on")
                self._admit_problems[queue] = problem
            else:
                self._admit_problems.pop(queue, None)
        if now - self._notify_looked_at >= NOTIFY_LOOK_EVERY_S:
            self._notify_looked_at = now
            self._notify_ended_runs(now)
        if now - self._pinned_at >= PIN_EVERY_S:
            self._pin_packages()
            self._pinned_at = now
        if now - self._cleaned_at >= CLEAN_EVERY_S:
            self._cleaned_at = now
            self._clean(now)
        if now - self._beat_at >= BEAT_S:  # once a whole step went through, dated at its end: a keeper whose steps
            self._beat_at = self._beat(self.clock())  # keep failing goes stale, and a helper replaces it
        return {"at": now, "keeper": {"version": self.version, "started": self.started},
                "queues": describe(self.store, now, reasons=reasons), "retries": self.lost.decisions(now),
                "pipelines": recent_runs(self.store, now)}

    def _beat(self, now: float) -> float:
        self.store.put("keeper", json.dumps({"at": now, "version": self.version}).encode())
        return now

    def watched_keys(self) -> list[str]:
        """What a step depends on: the store's keys and the order jobs in Ray's table."""
        return self.store.keys("") + self.store.keys(RAY_JOB_INFO_PREFIX + ORDER_PREFIX, namespace=RAY_JOB_NAMESPACE)

    def step_due(self, keys: list[str], since_step_s: float) -> bool:
        """Whether a step is due, given :meth:`watched_keys` now and the time since the last step."""
        if keys != self._keys_after_step or self._orders_deferred:
            return True
        return since_step_s >= (STEP_EVERY_S if self._waits(keys) else IDLE_STEP_EVERY_S)

    def waits(self) -> bool:
        """Whether anything waited at the last step (the keeper then looks often)."""
        return self._waits(self._keys_after_step or ())

    @staticmethod
    def _waits(keys: Any) -> bool:
        return any(key.startswith(("waiting/", "stop/", "retry/", RAY_JOB_INFO_PREFIX)) for key in keys)

    def note_keys_after_step(self) -> list[str]:
        """The watched keys once a step has changed them (its own writes are no reason for another)."""
        self._keys_after_step = self.watched_keys()
        return self._keys_after_step

    # Orders --------------------------------------------------------------------------------------------------

    def _take_orders(self, now: float) -> None:
        self._orders_deferred = False
        pending = sorted((info for info in ray_jobs(self.store, ORDER_PREFIX) if info.get("status") == "PENDING"
                          and self._supervisor_created(info, now)),
                         key=lambda info: (info.get("start_time") or 0, info["submission_id"]))
        other_code = {info["submission_id"]: code for info in pending
                      if (code := (info.get("metadata") or {}).get(METADATA_AGENT_VERSION)) not in (None, self.version)}
        stepped_for, refusal = order_to_step_aside_for(self.store, pending, other_code, now)
        if stepped_for is not None:
            raise StepAside(str(other_code[stepped_for]))
        orders = []
        for info in pending:
            if info["submission_id"] in other_code:  # stepped aside for, it would wait for good, and every keeper after
                orders.append((info, {"refused": refusal}))
                continue
            try:
                order = order_from((info.get("runtime_env") or {}).get("env_vars") or {})
            except Exception as exc:  # noqa: BLE001 - answered as what it is: no order this keeper can read
                order = {"unreadable": f"{type(exc).__name__}: {exc}"}
            orders.append((info, order))
        for info, order in orders:
            order_id = info["submission_id"]
            try:
                result = self.carry_out(order_id, order, (info.get("start_time") or now * 1000) / 1000, now)
            except Exception as exc:  # noqa: BLE001 - the client is told; the next order is carried out all the same
                result = {"error": f"{type(exc).__name__}: {last_line(str(exc))}"}
            try:
                self.jobs.settle(order_id, "STOPPED", answer_text(result))
            except Exception as exc:  # noqa: BLE001 - read again next step; the orders after it go on meanwhile
                self.say(f"order {order_id} was carried out, but could not be ended with its answer "
                         f"({type(exc).__name__}: {last_line(str(exc))}); it is read again")

    def _supervisor_created(self, info: dict[str, Any], now: float) -> bool:
        """Whether Ray has created the supervisor actor of a PENDING order yet (after ``PENDING_GRACE_S``: True).

        Ray lists a job before it creates its supervisor: one created after its order ended would, once placed,
        never exit and hold most of the head's resource (:func:`end_stray_order_supervisors` takes such down).
        """
        has_supervisor = getattr(self.jobs, "has_supervisor", None)
        if has_supervisor is None or now - float(info.get("start_time") or now * 1000) / 1000 >= PENDING_GRACE_S:
            return True
        created = has_supervisor(info["submission_id"]) is not False
        # Ray creates it a moment after it lists the job: the next tick looks again, not the next step's turn.
        self._orders_deferred = self._orders_deferred or not created
        return created

    def carry_out(self, order_id: str, order: dict[str, Any], submitted: float, now: float) -> Any:
        """Carry out one order (``order_id``: its job's id; ``submitted``: when Ray took it, the head's clock)."""
        if "unreadable" in order:
            return {"error": f"the order could not be read ({order['unreadable']})"}
        if "refused" in order:
            return {"error": f"the order was refused: {order['refused']}"}
        if order.get("format", ORDER_FORMAT) != ORDER_FORMAT:
            return {"error": f"an order of format {order.get('format')!r}; this keeper reads {ORDER_FORMAT}"}
        verb = order.get("verb")
        problem = order_problem(order, order_id)
        if problem is not None:
            return {"unknown": str(order.get("id"))[:200]} if verb == "stop" else {"error": problem}
        if verb == "enqueue":
            return enqueue(self.store, order, submitted)
        if verb == "stop":
            return self.stop(str(order["id"]), now)
        if verb == "set":
            return set_order(self.store, order, now)
        if verb == "seal":
            return seal_order(self.store, order, now)
        if verb == "ensure":
            return {"keeper": self.version}
        if verb == "withdraw":
            # Sent under the id of an order to enter the job that its client gave up on mid-way: holding that id, it
            # keeps a late copy of that order out of Ray's table, and so the job out of its queue.
            return {"withdrawn": str(order.get("id"))}
        return {"error": f"unknown order {verb!r}"}

    def stop(self, job_id: str, now: float, _followed: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Stop job ``job_id`` wherever it is: waiting (it ends without running), running (Ray stops it), or lost and
        waiting to be submitted again (no further attempt is submitted)."""
        entry_key = next((found for found in self.store.keys("waiting/") if found.rpartition("/")[2] == job_id), None)
        if entry_key is not None:
            queue = entry_key.split("/")[1]
            entry = json.loads(self.store.get(entry_key) or b"{}")
            position = next((index for index, (other, _) in enumerate(waiting(self.store, queue), start=1)
                             if other == job_id), 0)
            # Its stand-in asks Ray for the stop itself, once its record and notification are out.
            self._end_without_running(queue, job_id, entry, Admission(
                queue, waited_s=now - float(entry.get("submitted") or now), position=position,
                outcome="STOPPED", reason=f"stopped while it waited in queue {queue} (position {position})"))
            return {"stopped": job_id, "was": STOP_FOUND_WAITING, "queue": queue}
        if self.lost.cancel(job_id):
            return {"stopped": job_id, "was": STOP_FOUND_RETRY_DUE}
        if ray_job_info(self.store, job_id) is not None:
            if self.jobs.stop(job_id):
                return {"stopped": job_id, "was": STOP_FOUND_RUNNING}
            # Ended: lost whole, and its next attempt already submitted or waiting in its queue? That is the run
            # the stop was asked of.
            # A chain of attempts written by another hand may loop back: each is followed once.
            following = self.lost.next_attempt_of(job_id)
            if following is not None and following != job_id and following not in _followed:
                found = self.stop(following, now, _followed | {job_id})
                if "unknown" not in found:
                    return {**found, "stopped": job_id, "attempt": found.get("attempt", following)}
            return {"stopped": job_id, "was": STOP_FOUND_ENDED}
        return {"unknown": job_id}

    def _handle_stops(self, now: float) -> None:
        """Stops written into the store by order jobs that ran as helper jobs (no keeper was alive then)."""
        for key in self.store.keys("stop/"):
            job_id = key.partition("/")[2]
            asked = json.loads(self.store.get(key) or b"{}")
            result = self.stop(job_id, now)
            if "unknown" in result and now - float(asked.get("at") or now) < ENQUEUE_IN_FLIGHT_S:
                continue  # its entry may still be on its way (its own order runs as a helper job too)
            self.store.delete(key)

    # Admission ------------------------------------------------------------------------------------------------

    def _admit(self, queue: str, now: float) -> dict[str, str]:
        """Submit the first jobs of ``queue`` while they may start; why the first one left waits, and why each job of
        a pipeline passed over waits (by id)."""
        while True:
            passed_over: dict[str, str] = {}
            entries = self._lined_up(queue, waiting(self.store, queue), passed_over, now)
            if not entries:
                return passed_over
            job_id, entry = entries[0]
            if ray_job_info(self.store, job_id) is not None:
                # Ray has it already (the keeper died between submitting it and forgetting its entry): it runs
                # in the slot it was given then, and takes no second one.
                self._forget(queue, job_id)
                continue
            reason = self._why_not_now(queue, job_id, entry, now)
            if reason:
                return {**passed_over, job_id: reason}
            slot_map = slots(self.store, queue, now)
            slot = free_slot(slot_map, max_running(self.store, queue))
            assert slot is not None  # _why_not_now read the same limit
            granted, needs = self._grant(queue, job_id, entry, now)
            holder = {"id": job_id, "name": entry.get("name"), "since": now, "needs": needs}
            generation = claim(self.store, queue, slot, holder, self.pause)
            if generation is None:
                return {**passed_over, job_id: f"another admission took slot {slot.index} of queue {queue} first"}
            admission = Admission(queue, slot.index, generation, waited_s=now - float(entry.get("submitted") or now),
                                  position=1, admitted_at=self.clock(), granted=granted)
            entry = {**entry, "needs": holder["needs"]}
            if not self._submit(queue, job_id, entry, admission, slot):
                return {**passed_over, job_id: f"Ray did not take its request yet; trying again in {RETRY_SUBMIT_S:g}s"}

    def _newest_entry_of_each_run(self) -> dict[str, float]:
        """When the newest entry of each pipeline run was entered: a run still being sent is not given up."""
        newest: dict[str, float] = {}
        for raw in self.store.multi_get(self.store.keys("waiting/")).values():
            entry = json.loads(raw)
            if entry.get("pipeline"):
                run = str(entry["pipeline"])
                newest[run] = max(newest.get(run, 0.0), float(entry.get("submitted") or 0.0))
        return newest

    def _first_submitted(self, queue: str) -> tuple[float, str]:
        entries = waiting(self.store, queue)
        return (min(float(entry.get("submitted") or 0.0) for _, entry in entries) if entries else float("inf"), queue)

    def _lined_up(self, queue: str, entries: list[tuple[str, dict[str, Any]]], passed_over: dict[str, str],
                  now: float) -> list[tuple[str, dict[str, Any]]]:
        """The waiting jobs of ``queue`` that may take a slot, in order: a job of a pipeline once its run is sealed
        and every job it runs after SUCCEEDED. One that never will (one of them failed, was stopped or is gone, or
        its run was never sealed) ends here without running; why each other one is passed over goes into
        ``passed_over``."""
        most = quota(self.store, queue)
        if not most and not any(entry.get("pipeline") for _, entry in entries):
            return entries
        waiting_ids = {key.rpartition("/")[2] for key in self.store.keys("waiting/")}
        newest = self._newest_entry_of_each_run() if any(entry.get("pipeline") for _, entry in entries) else {}
        lined_up = []
        for position, (job_id, entry) in enumerate(entries, start=1):
            if not is_sealed(self.store, entry.get("pipeline")):
                if now - newest.get(entry["pipeline"], now) <= UNSEALED_KEPT_S:
                    passed_over[job_id] = f"pipeline run {entry['pipeline']} is still being submitted"
                    continue
                state, why = PIPELINE_FAILED, (f"not run: its pipeline run {entry['pipeline']} was never started (the "
                                               "client that submitted it went away before entering every job)")
            else:
                state, why = blocked_by(self.store, entry, waiting_ids, self.lost.next_attempt_of)
            if state == PIPELINE_FAILED:
                note_not_run(self.store, job_id, why)
                self.say(f"queue {queue}: job {job_id} {why}")
                self._end_without_running(queue, job_id, entry, Admission(
                    queue, waited_s=now - float(entry.get("submitted") or now), position=position, outcome="FAILED",
                    reason=why))
            elif state:
                passed_over[job_id] = why
            elif (bigger := {name: amount for name, amount in (entry.get("needs") or {}).items()
                             if name in most and float(amount) > most[name] + 1e-9}):
                # Its queue's quota was lowered below what it needs after it entered: it waits for the quota to be
                # raised, and holds up no one meanwhile. Only a job that may otherwise run waits so: one whose
                # pipeline will never let it run ends first.
                passed_over[job_id] = (f"it needs {', '.join(f'{amount:g} {name}' for name, amount in bigger.items())}"
                                       f", more than queue {queue}'s whole quota; it waits for the quota to be raised")
            else:
                lined_up.append((job_id, entry))
        return lined_up

    def _why_not_now(self, queue: str, job_id: str, entry: dict[str, Any], now: float) -> str:
        if now < self._retry_at.get(job_id, 0.0):
            return f"Ray did not take its request; trying again in {self._retry_at[job_id] - now:.0f}s"
        limit = max_running(self.store, queue)
        running = len(held(slots(self.store, queue, now)))
        if limit is not None and running >= limit:
            return f"{running} of {limit} running in queue {queue}"
        needs = entry.get("needs") or {}
        most = quota(self.store, queue)
        if most:
            over = over_quota(queue, needs, quota_use(held(slots(self.store, queue, now))), most)
            if over:
                return over
        if needs:
            every_queue = {name: slots(self.store, name, now) for name in queues_in(self.store)}
            # What is promised is read before what is free: a placement seen in between counts as both, never as
            # neither.
            promised = not_yet_placed(self.store, every_queue)
            short = shortfall(needs, self.store.free_resources(), promised)
            if short:
                return short
        mine = order_key(job_id, entry)
        earlier = [other for other, place in enqueues_in_flight(self.store, queue, now)
                   if other != job_id and order_key(other, place) < mine]
        if earlier:
            return f"{earlier[0]}, submitted just before it, is still being queued"
        return ""

    def _grant(self, queue: str, job_id: str, entry: Mapping[str, Any],
               now: float) -> tuple[dict[str, float], dict[str, float]]:
        """What the workers of a job that takes what is free (``grows``: an ``auto`` layout's CPUs) are let in with,
        and what the job then holds in all (its grant and its entrypoint's own, counted as its own while it runs).

        The grant is every whole unit free now (and within its queue's quota), less what the jobs let in before it
        have not placed yet and what its own entrypoint will hold, and never less than its workers need to start.
        """
        needs = dict(entry.get("needs") or {})
        grows = entry.get("grows") or []
        if not grows:
            return {}, needs
        every_queue = {name: slots(self.store, name, now) for name in queues_in(self.store)}
        pending = not_yet_placed(self.store, every_queue)
        free = self.store.free_resources()
        request = json.loads(self.store.get(f"request/{job_id}") or b"{}")
        entrypoint = {"CPU": float(request.get("entrypoint_num_cpus") or 0),
                      "GPU": float(request.get("entrypoint_num_gpus") or 0),
                      **{name: float(amount) for name, amount in (request.get("entrypoint_resources") or {}).items()}}
        most = quota(self.store, queue)
        used = quota_use(held(slots(self.store, queue, now))) if most else {}
        granted = {}
        for name in grows:
            least = float(needs.get(name, 0.0)) - entrypoint.get(name, 0.0)
            takes = float(int(free.get(name, 0.0) - pending.get(name, 0.0) - entrypoint.get(name, 0.0) + 1e-9))
            if name in most:  # the queue's quota caps what is free to it
                takes = min(takes, float(int(most[name] - used.get(name, 0.0) - entrypoint.get(name, 0.0) + 1e-9)))
            granted[name] = max(least, takes)
            needs[name] = granted[name] + entrypoint.get(name, 0.0)
        return granted, needs

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
            if ray_job_info(self.store, job_id) is None:
                release(self.store, queue, slot.index, admission.generation)
                self._retry_at[job_id] = self.clock() + RETRY_SUBMIT_S
                self.say(f"queue {queue}: could not submit job {job_id} ({type(exc).__name__}: "
                         f"{last_line(str(exc))}); trying again in {RETRY_SUBMIT_S:g}s")
                return False
            # No answer came, but Ray created the job: it holds the slot it was given.
        self._forget(queue, job_id)
        if entry.get("needs"):
            self.store.put(f"needs/{job_id}", json.dumps(entry["needs"]).encode())
        # Its place in its queue: lost whole, its next attempt goes back there, ahead of the jobs entered since.
        self.store.put(f"place/{job_id}", json.dumps({"submitted": entry.get("submitted")}).encode())
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
                     f"({type(exc).__name__}: {last_line(str(exc))})")

    def _forget(self, queue: str, job_id: str) -> None:
        self.store.delete(f"waiting/{queue}/{job_id}")
        self.store.delete(f"request/{job_id}")
        self._retry_at.pop(job_id, None)

    # Pipeline runs' notifications -------------------------------------------------------------------------------

    def _notify_ended_runs(self, now: float) -> None:
        """Start the sending of each sealed run's notification once every job of it has ended or was not run."""
        try:
            runs = runs_to_notify(self.store)
            if not runs:
                return
            waiting_ids = {key.rpartition("/")[2] for key in self.store.keys("waiting/")}
            for run_id, run in runs.items():
                ends = run_end(self.store, run, waiting_ids, self.lost.next_attempt_of)
                if ends is None or not claim_notification(self.store, run_id, now):
                    continue
                threading.Thread(target=self._send_run_end, args=(run_id, run, ends, now), daemon=True,
                                 name=f"{NOTIFY_THREAD}-{run_id}").start()
            self._notify_problem = ""
        except Exception as exc:  # noqa: BLE001 - a notification is a courtesy: the queue goes on without it
            problem = f"{type(exc).__name__}: {mask_url_userinfo(last_line(str(exc)))}"
            if problem != self._notify_problem:
                self.say(f"pipeline notifications: {problem}; the queue goes on, and looks again")
            self._notify_problem = problem

    def _send_run_end(self, run_id: str, run: dict[str, Any], ends: dict[str, Any], now: float) -> None:
        try:
            # One run's message at a time: a send reads why a target failed off Apprise's one process-wide logger.
            with self._sending:
                notify_run_end(run_id, run, ends, now, sender=self.send_notification)
        except Exception as exc:  # noqa: BLE001 - its own thread: nothing above it would say why
            self.say(f"pipeline run {run_id}: its notification failed ({type(exc).__name__}: "
                     f"{mask_url_userinfo(last_line(str(exc)))[:200]}); the run is unchanged")

    # Upkeep ---------------------------------------------------------------------------------------------------

    def _pin_packages(self) -> None:
        pin = getattr(self.store, "pin_package", None)
        if pin is None:
            return
        uris = [uri for raw in self.store.multi_get(self.store.keys("waiting/")).values()
                for uri in json.loads(raw).get("packages") or []]
        uris += self.lost.packages()
        for uri in uris:
            try:
                pin(uri, PIN_FOR_S)
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                self.say(f"could not keep package {uri} of a waiting job: {exc}")

    def _clean(self, now: float) -> None:
        end_stray_order_supervisors(self.store, self.jobs, self.say)
        for job_id in finished_orders(self.store, now):
            try:
                self.jobs.delete(job_id)
            except Exception:  # noqa: BLE001 - left for the next round
                pass
        self.lost.forget_deleted()
        forget_old_runs(self.store, now)

def end_stray_order_supervisors(store: KeyValue, jobs: Any, say: Callable[[str], None]) -> list[str]:
    """Take down the supervisor actors of order jobs that have ended or left Ray's table, and return their ids.

    Such a supervisor (an order ended before Ray created it, or a keeper killed between ending an order and taking
    its supervisor down) holds most of the head's resource once placed, and never exits: no keeper is placed again
    until it goes.
    """
    supervised_orders = getattr(jobs, "supervised_orders", None)
    if supervised_orders is None:
        return []
    try:
        # The actors first, then the table: Ray lists a job before it creates its supervisor, so every supervisor
        # seen belongs to a job the table then shows, unless that job ended or was deleted.
        supervised = supervised_orders()
        live = {info["submission_id"] for info in ray_jobs(store, ORDER_PREFIX) if info.get("status") not in TERMINAL}
        stray = [job_id for job_id in supervised if job_id not in live]
        for job_id in stray:
            jobs.kill_supervisor(job_id)
    except Exception as exc:  # noqa: BLE001 - the next round looks again
        say(f"could not look for the supervisors of ended orders: {type(exc).__name__}: {last_line(str(exc))}")
        return []
    if stray:
        say(f"took down the supervisors of {len(stray)} ended order(s), which held the head's resource: "
            f"{', '.join(stray[:5])}")
    return stray
