"""The cluster's queue, seen from the client: what its keeper last published, and the orders that change it.

A waiting job is no Ray job yet: it is an entry in the cluster's key-value store
(``rayjobs_agent/queueing.py``), which most clusters do not expose outside themselves.
So reading and writing take the ways in that every cluster offers:

- **Reading** (``rayjobs queue``, ``status`` and ``list`` of a waiting job, a follower waiting for its
  turn): the queue's keeper writes what it sees to ``rayjobs-queue.json`` in the head node's Ray log
  folder at every change, and Ray's own log API serves that file. One request, no process started.
- **Writing** (entering a job, asking for a stop, setting a limit): one request to Ray's job API, an
  order job that never runs while a keeper lives (it waits for the keeper, which reads it from Ray's
  table, carries it out and answers in the job's message). With no keeper alive, the same order runs
  as a helper job on the head node that starts one (a few seconds, once). No word of an order
  reaches a shell: it travels in the order job's variables. An order that waits unanswered while the
  keeper's snapshot has gone stale (its process stopped, its loop hung) is followed by one that needs
  none of the head's resource: its helper job runs beside the hung keeper and replaces it.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobs.infra.status import is_terminal
from rayjobs_agent import AGENT_PACKAGE_DIR
from rayjobs_agent.queueing import (KEEPER_HUNG_AFTER_S, NO_KEEPER_ANSWER_KEY, ORDER_PREFIX, ORDER_RESOURCES, RECOVERY_RESOURCES,
                                    SNAPSHOT_FILE, STOP_FOUND_ENDED, STOP_FOUND_RETRY_DUE, STOP_FOUND_RUNNING,
                                    STOP_FOUND_WAITING, answer_in, enqueue_order_id, order_submission,
                                    ran_as_helper)
from rayjobs_agent.wire import METADATA_ENQUEUES, METADATA_PRIORITY, METADATA_QUEUED_ID, METADATA_SPEC_HASH
from runner.errors import BadInput, ClusterRequestFailed, JobNotFound, NotADashboard
from runner.reporter import say

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi

# How long an order's answer is waited for: a keeper answers within a second; an order that runs as a helper job
# (no keeper was alive) takes a job's start, which on a loaded cluster can be long.
ANSWER_WAIT_S = 120.0
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5
# How often a client whose order waits unanswered looks whether the keeper's snapshot says it is hung.
_HUNG_LOOK_EVERY_S = 5.0
# How much of a helper job's log is read for its answer: it prints it last, before Ray's few lines of leaving.
_HELPER_LOG_TAIL_LINES = 200


class ClusterQueue:
    """The queue of the cluster that ``api`` reaches."""

    def __init__(self, api: JobsApi) -> None:
        self.api = api
        self._head_node: str | None = None
        self._helper_answers: dict[tuple[str, Any], Any] = {}

    def snapshot(self) -> dict[str, Any] | None:
        """What the keeper published last (``queues``: each queue's limit, running and waiting jobs); None when the
        cluster has never had a keeper."""
        try:
            body = self._snapshot_file()
        except (ClusterRequestFailed, NotADashboard):
            return None  # no such file: no keeper has run on this head (or no state API to read it with)
        try:
            return json.loads(body.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None

    def describe(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Every queue (or the one named), as the keeper last saw it: limit, running jobs, waiting jobs in order."""
        queues = (self.snapshot() or {}).get("queues") or []
        return [found for found in queues if queue is None or found.get("queue") == queue]

    def place_of(self, job_id: str, snapshot: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Where job ``job_id`` waits (``queue``, ``position``, ``reason``, …), or None when it waits in none.

        A job whose order to enter its queue has not been carried out yet waits too, its position not yet known.
        """
        snapshot = snapshot if snapshot is not None else self.snapshot()
        for queue in (snapshot or {}).get("queues") or []:
            for job in queue.get("waiting") or []:
                if job.get("id") == job_id:
                    return {**job, "queue": queue.get("queue"), "max_running": queue.get("max_running"),
                            "running": len(queue.get("running") or [])}
        return self.being_entered(job_id, published_at=(snapshot or {}).get("at"))

    def being_entered(self, job_id: str, published_at: float | None = None) -> dict[str, Any] | None:
        """Job ``job_id`` as its order to enter its queue shows it while the keeper has not carried it out, or has
        carried it out after ``published_at`` (when the snapshot read was written; None: no snapshot) and published
        nothing since (None: no such order waits)."""
        try:
            order = self.api.get_job(enqueue_order_id(job_id))
        except JobNotFound:
            return None
        metadata = order.get("metadata") or {}
        if not metadata.get(METADATA_ENQUEUES):
            return None  # withdrawn
        reason = "being entered into its queue"
        if is_terminal(order.get("status")):
            # Carried out: the job is in the keeper's snapshot, in Ray's table, or refused; or the keeper died after
            # it answered and before it published, and the job waits where no snapshot shows it yet.
            published_before = published_at is None or (order.get("end_time") or 0) / 1000 > float(published_at)
            if not published_before:
                return None
            # A keeper ends an order it carried out STOPPED, its answer the message. Ray writes a failed job's last
            # lines there: a job of someone else's under the order's id could print one.
            answer = answer_in(order.get("message") or "") if order.get("status") == "STOPPED" else None
            if answer is None and order.get("status") == "SUCCEEDED":
                # Carried out by a helper job (no keeper was alive), whose answer is in its log: often so on a head
                # just restarted, whose keeper has published nothing yet. An ended job's log is read once.
                answer = self._helper_answer(job_id, order)
            if not (isinstance(answer, dict) and "queued" in answer):
                return None
            reason = "entered into its queue; its keeper has published nothing since"
        return {"id": job_id, "queue": metadata.get(METADATA_ENQUEUES), "position": None,
                "priority": int(metadata.get(METADATA_PRIORITY) or 0), "spec_hash": metadata.get(METADATA_SPEC_HASH),
                "submitted": (order.get("start_time") or 0) / 1000, "metadata": metadata, "reason": reason}

    def _helper_answer(self, job_id: str, order: dict[str, Any]) -> Any:
        """The answer in the log of the order that entered job ``job_id``, which ran as a helper job and ended (None:
        none read, or the job under the order's id is no helper of ours)."""
        if not ran_as_helper(order, "enqueue", job_id):
            return None
        order_id = enqueue_order_id(job_id)
        seen = (order_id, order.get("end_time"))
        if seen not in self._helper_answers:
            try:
                log = self._helper_log(order_id, order)
            except (ClusterRequestFailed, NotADashboard, JobNotFound):
                return None  # deleted meanwhile, or no log to read: looked at again next time
            self._helper_answers[seen] = answer_in(log)
        return self._helper_answers[seen]

    def _helper_log(self, order_id: str, order: dict[str, Any]) -> str:
        """The last lines of the log of order ``order_id`` (``order``: Ray's record of it), which ran as a helper job:
        its answer is among them, printed before Ray's few lines of leaving; a long log is no answer."""
        return self.api.job_log(order_id, tail=_HELPER_LOG_TAIL_LINES, driver_node_id=order.get("driver_node_id"))

    def entry_of(self, job_id: str) -> dict[str, Any] | None:
        """The order that entered job ``job_id`` into its queue, as Ray's table keeps it until the job is in Ray's
        table itself (``queue``, ``metadata`` with the spec's hash, ``status``); None when there is none."""
        found = self._order_metadata(enqueue_order_id(job_id))
        return found if found.get("queue") else None  # an order that withdrew the job enters none

    def waiting_jobs(self, snapshot: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every waiting job, each with its ``queue``, in the order of its queue."""
        return [{**job, "queue": queue.get("queue")}
                for queue in ((snapshot if snapshot is not None else self.snapshot()) or {}).get("queues") or []
                for job in queue.get("waiting") or []]

    def decision_about(self, job_id: str) -> dict[str, Any] | None:
        """What the keeper decided about job ``job_id``, lost whole: ``retry``, and ``next`` (the next attempt's id)
        with ``due`` when it is submitted again (None: nothing decided, or no keeper)."""
        return ((self.snapshot() or {}).get("retries") or {}).get(job_id)

    def enqueue(self, request: dict[str, Any], *, queue: str, priority: int, needs: dict[str, float], name: str,
                agent_modules: list[str], wait: bool = True, grows: list[str] | None = None,
                pipeline: dict[str, Any] | None = None) -> dict[str, Any]:
        """Enter job request ``request`` (its body as Ray's client sends it, packages uploaded) into ``queue``.

        The order job that carries it has the id ``rayjobs-order-enqueue-ID``, which Ray takes once: of two clients
        entering one id at once, the second is answered ``exists`` with the first one's metadata.

        Args:
            wait: wait for the keeper's answer (the job's place); without it, return once the order is taken.
            grows: the resources the job takes more of when more are free (``jobs.queueing.queue_grows``).
            pipeline: for a job of a pipeline run, ``{"run", "job", "after"}`` (the run's id, the job's name in it,
                the ids of the jobs it runs after): it lines up once :meth:`seal` sealed the run.

        Returns:
            ``{"queued", "position", …}`` (``{"queued"}`` alone without ``wait``), or
            ``{"exists": "ray"|"queue", "metadata", "status"}`` when a job of that id is already in Ray's table or
            being entered into a queue.
        """
        job_id = request["submission_id"]
        runtime_env = request.get("runtime_env") or {}
        packages = [uri for uri in [runtime_env.get("working_dir"), *(runtime_env.get("py_modules") or [])]
                    if isinstance(uri, str) and uri.startswith("gcs://")]
        order = {"verb": "enqueue", "queue": queue, "id": job_id, "name": name, "priority": priority,
                 "needs": needs, "grows": list(grows or []), "request": request, "packages": packages,
                 "agent_modules": agent_modules}
        if pipeline is not None:
            order.update(pipeline=pipeline["run"], pipeline_job=pipeline["job"], after=list(pipeline["after"]))
        metadata = {METADATA_ENQUEUES: queue, METADATA_PRIORITY: str(priority), METADATA_QUEUED_ID: job_id,
                    METADATA_SPEC_HASH: str((request.get("metadata") or {}).get(METADATA_SPEC_HASH) or "")}
        order_id = enqueue_order_id(job_id)
        if not self._send(order, order_id, metadata) and not (self._clear_withdrawal(order_id)
                                                               and self._send(order, order_id, metadata)):
            found = self.entry_of(job_id) or {}
            return {"exists": "queue", "queue": found.get("queue") or queue, "metadata": found.get("metadata") or {},
                    "status": None}
        try:
            # The id may have reached Ray's table just before this order was taken (an earlier job of the same id,
            # let in by its keeper, which then gave the order's id up): the order is then answered `exists` too.
            existing = self.api.get_job(job_id)
        except JobNotFound:
            existing = None
        if existing is not None:
            return {"exists": "ray", "status": existing.get("status"), "metadata": existing.get("metadata") or {},
                    "queue": None}
        return self.answer(order_id) if wait else {"queued": queue}

    def withdraw(self, job_id: str) -> bool:
        """After Ctrl-C while job ``job_id`` was being entered: make sure an order to enter it that may still be on its
        way enters nothing, by taking its order's id with an order that withdraws the job.

        Returns:
            True when no order to enter the job had reached Ray (and none ever will), False when one had: the job is
            entered, or being entered.
        """
        return self._send({"verb": "withdraw", "id": job_id}, enqueue_order_id(job_id), {METADATA_QUEUED_ID: job_id})

    def _clear_withdrawal(self, order_id: str) -> bool:
        """Delete the order that withdrew an earlier submission of this job (it kept a late copy of that submission's
        order out), so that a new submission may enter the job. False when an order to enter the job holds the id."""
        try:
            order = self.api.get_job(order_id)
        except JobNotFound:
            return True
        if (order.get("metadata") or {}).get(METADATA_ENQUEUES):
            return False
        if not is_terminal(order.get("status")):
            self.answer(order_id)
        self.api.delete_job(order_id)
        return True

    def forget_entry(self, job_id: str) -> None:
        """Delete the order that entered job ``job_id``, once the job is deleted: it kept the id while the job waited,
        and would keep it for minutes more from a new submission of the same id."""
        try:
            order = self.api.get_job(enqueue_order_id(job_id))
        except JobNotFound:
            return
        if is_terminal(order.get("status")):
            self.api.delete_job(enqueue_order_id(job_id))

    def seal(self, run_id: str, jobs: dict[str, str], after: dict[str, list[str]], *, pipeline: str | None = None,
             notify: str | None = None) -> dict[str, Any]:
        """Seal pipeline run ``run_id`` (job name -> job id; name -> the names it runs after), every job of it
        entered: its jobs line up from now on. ``pipeline``: its name; ``notify``: where its end is told, as
        ``jobs.notify.job_notify_settings`` gives them (inside the order, as an entered job's own settings travel;
        the keeper never shows them). The keeper's answer: ``{"sealed", "jobs"}``, or ``{"error"}`` naming the jobs
        never entered."""
        order_id = f"{ORDER_PREFIX}seal-{run_id}"
        order: dict[str, Any] = {"verb": "seal", "run": run_id, "jobs": jobs, "after": after}
        if pipeline:
            order["pipeline"] = pipeline
        if notify:
            order["notify"] = notify
        self._send(order, order_id)
        return self.answer(order_id, refusal_raises=False)

    def pipeline(self, run_id: str, snapshot: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Pipeline run ``run_id`` as the keeper last published it: ``{"jobs": {name: id}, "after": {name: [name]}}``
        (None: no such run, or not sealed)."""
        snapshot = snapshot if snapshot is not None else self.snapshot()
        return ((snapshot or {}).get("pipelines") or {}).get(run_id)

    def ensure_keeper(self) -> None:
        """Make sure the cluster has a keeper, without waiting: it submits again the jobs lost whole that their spec
        retries, followed or not (an order that a live keeper answers at once, or that starts one)."""
        self._send({"verb": "ensure"}, f"{ORDER_PREFIX}ensure-{uuid.uuid4().hex[:16]}")

    def stop(self, job_id: str) -> dict[str, Any]:
        """Ask the keeper to stop job ``job_id`` (taken out of its queue, or stopped by Ray once it runs)."""
        order_id = f"{ORDER_PREFIX}stop-{uuid.uuid4().hex[:16]}"
        self._send({"verb": "stop", "id": job_id}, order_id)
        return self.answer(order_id)

    def set_limit(self, queue: str, max_running: int | None,
                  quota: dict[str, float] | None = None) -> list[dict[str, Any]]:
        """Change ``queue``'s limits on the cluster: its jobs at once and its quota (resource name -> the most its
        running jobs hold together), each kept when not given; neither given removes every limit. The queue as it
        is now."""
        order_id = f"{ORDER_PREFIX}set-{uuid.uuid4().hex[:16]}"
        order: dict[str, Any] = {"verb": "set", "queue": queue, "max_running": max_running}
        if quota:
            order["quota"] = quota
        self._send(order, order_id)
        return self.answer(order_id)

    def _send(self, order: dict[str, Any], order_id: str, metadata: dict[str, str] | None = None,
              resources: dict[str, float] = ORDER_RESOURCES) -> bool:
        """Submit the order job; False when an order of that id is already in Ray's table."""
        submission = order_submission(order, order_id, [str(AGENT_PACKAGE_DIR)], metadata, resources)
        try:
            self.api.submit(submission)
        except (BadInput, ClusterRequestFailed) as refused:
            try:
                self.api.get_job(order_id)
            except JobNotFound:
                raise refused from None
            return False
        return True

    def _order_metadata(self, order_id: str) -> dict[str, Any]:
        try:
            order = self.api.get_job(order_id)
        except JobNotFound:
            return {}
        return {"metadata": order.get("metadata") or {}, "queue": (order.get("metadata") or {}).get(METADATA_ENQUEUES),
                "status": order.get("status")}

    def answer(self, order_id: str, within_s: float = ANSWER_WAIT_S, *, refusal_raises: bool = True) -> Any:
        """The answer to order ``order_id``, once the keeper (or the helper job it ran as) has given it.

        ``refusal_raises``: an answer ``{"error": …}`` (the keeper refused the order) raises; without it, it is
        returned, for a caller that says what a refusal means.

        Raises:
            ClusterRequestFailed: no answer in ``within_s``, or an answer that says the order failed.
        """
        started = time.monotonic()
        deadline, pause, looked_at = started + within_s, _POLL_FIRST_S, started
        info: dict[str, Any] = {}
        while time.monotonic() < deadline:
            info = self.api.get_job(order_id)
            if is_terminal(info.get("status")):
                break
            if info.get("status") == "PENDING" and time.monotonic() - looked_at >= _HUNG_LOOK_EVERY_S:
                looked_at = time.monotonic()
                if self._replace_hung_keeper(info, waited_s=looked_at - started):
                    looked_at = float("inf")  # once: the keeper that replaces it reads the order
            time.sleep(pause)
            pause = min(_POLL_MAX_S, pause * 1.5)
        else:
            raise ClusterRequestFailed(f"the cluster's queue did not answer order {order_id} within {within_s:g}s "
                                       f"(it is {info.get('status')}); `rayjobs queue` shows what the queue holds")
        found = answer_in(info.get("message") or "")
        log = ""
        if found is None:
            log = self._helper_log(order_id, info)
            found = answer_in(log)
        if isinstance(found, dict) and found.get(NO_KEEPER_ANSWER_KEY):
            say(f"order {order_id} was carried out, but its helper job could not start the queue's keeper "
                f"({found[NO_KEEPER_ANSWER_KEY]}); the next order starts one")
        if isinstance(found, dict) and "error" in found and not refusal_raises:
            return found
        if found is None or (isinstance(found, dict) and "error" in found):
            tail = "\n".join(log.splitlines()[-5:])
            problem = found["error"] if isinstance(found, dict) else f"order {order_id} ended {info.get('status')}"
            raise ClusterRequestFailed(f"the cluster's queue could not carry out the order: {problem}"
                                       + (f"; its log ends:\n{tail}" if tail and found is None else ""))
        return found

    def _replace_hung_keeper(self, order: dict[str, Any], waited_s: float) -> bool:
        """Whether an order that waits PENDING (``order``: Ray's record of it, ``waited_s`` since it was in Ray's
        table) waits for a keeper that works no more, whose snapshot is older than :data:`KEEPER_HUNG_AFTER_S`; if so,
        an order that needs none of the head's resource is sent, whose helper job replaces that keeper."""
        snapshot = self.snapshot()
        if not snapshot:
            return False  # no keeper has run here, or no log API to tell: nothing to judge by
        # The head's clock now, at least: when Ray took the order, by that clock, and the time waited since.
        head_now = (order.get("start_time") or 0) / 1000 + waited_s
        if head_now - float(snapshot.get("at") or 0) < KEEPER_HUNG_AFTER_S:
            return False
        self.replace_keeper()
        return True

    def replace_keeper(self) -> None:
        """Send an order that needs none of the head's resource: it runs beside a keeper that works no more (one
        that still holds its share of the resource, so that no other order is placed), and its helper job
        replaces that keeper."""
        self._send({"verb": "ensure"}, f"{ORDER_PREFIX}recover-{uuid.uuid4().hex[:16]}", resources=RECOVERY_RESOURCES)

    def _snapshot_file(self) -> bytes:
        if self._head_node is not None:
            try:
                return self._read_snapshot(self._head_node)
            except (ClusterRequestFailed, NotADashboard):
                self._head_node = None  # a head that restarted is a node of another id: it is looked up again
        return self._read_snapshot(self._find_head_node())

    def _read_snapshot(self, node: str) -> bytes:
        query = urllib.parse.urlencode({"node_id": node, "filename": SNAPSHOT_FILE, "lines": -1})
        return self.api.get_raw(f"/api/v0/logs/file?{query}")

    def _find_head_node(self) -> str:
        query = urllib.parse.urlencode({"filter_keys": "is_head_node", "filter_predicates": "=",
                                        "filter_values": "True"})
        nodes = (self.api.get_json(f"/api/v0/nodes?{query}").get("data") or {}).get("result", {}).get("result") or []
        # After a restart of a head that keeps the GCS in Redis, the old head stays in the node table, DEAD.
        alive = [node for node in nodes if node.get("state", "ALIVE") == "ALIVE"]
        if not alive:
            raise ClusterRequestFailed("the cluster named no live head node")
        self._head_node = str(alive[0]["node_id"])
        return self._head_node


@dataclass(frozen=True)
class StopFound:
    """Where a stop found its job, as the keeper or Ray answered it.

    ``found``: ``"stopped"`` (a stop was asked of Ray), ``"queued"`` (taken out of its queue: it never starts),
    ``"withdrawn"`` (it had run and was lost whole: its next attempt is not submitted), ``"ended"`` (nothing to stop)
    or ``"requested"`` (the queue takes the stop and carries it out at its next step, wherever the job is then).
    ``attempt``: the next attempt of a job lost whole that the stop acted on instead (None: the job itself).
    """

    found: str
    attempt: str | None = None


def stop_job(api: JobsApi, job_id: str) -> StopFound:
    """Stop a job wherever it is: running (Ray stops it), waiting in a queue (its keeper takes it out), or lost whole
    and waiting to be submitted again (no further attempt is submitted; one already submitted or entered is stopped).

    Raises:
        JobNotFound: neither Ray nor any queue knows the job.
    """
    try:
        if api.stop_job(job_id):
            return StopFound("stopped")
    except JobNotFound:
        queue = ClusterQueue(api)
        # An order that entered the job a moment ago may not show in the keeper's snapshot yet: the keeper, which
        # carries out the stop after it, knows.
        if queue.place_of(job_id) is None and queue.entry_of(job_id) is None:
            raise
        answer = queue.stop(job_id)
        if isinstance(answer, dict) and "unknown" in answer:
            raise JobNotFound(f"no job {job_id!r} on the cluster at {api.address}, waiting or running") from None
        # Its turn may have come while the stop was on its way: the keeper then had Ray stop it (or found it ended).
        return _what_the_stop_found(answer)
    decision = ClusterQueue(api).decision_about(job_id)
    if decision and decision.get("retry") and decision.get("next"):
        # Lost, and waiting for its next attempt: none is submitted; unless the keeper had submitted it already.
        return _what_the_stop_found(ClusterQueue(api).stop(job_id))
    return StopFound("ended")


def _what_the_stop_found(answer: Any) -> StopFound:
    """Where the keeper's answer to a stop (``was``, and ``attempt`` when it acted on the next attempt of a job lost
    whole) says the stop found the job; ``requested`` when the answer says no more (a helper job took the stop)."""
    if not isinstance(answer, dict):
        return StopFound("requested")
    found = {STOP_FOUND_RUNNING: "stopped", STOP_FOUND_ENDED: "ended", STOP_FOUND_RETRY_DUE: "withdrawn",
             STOP_FOUND_WAITING: "queued"}.get(answer.get("was"), "requested")
    attempt = answer.get("attempt")
    return StopFound(found, str(attempt) if isinstance(attempt, str) and attempt else None)


__all__ = ["ClusterQueue", "StopFound", "stop_job"]
