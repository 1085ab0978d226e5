"""The cluster's queue, seen from the client: what its keeper last published, and the small jobs that change it.

A waiting job is no Ray job yet: it is an entry in the cluster's key-value store
(``rayjobs_agent/queueing.py``), which most clusters do not expose outside themselves.
So reading and writing take the two ways in that every cluster offers:

- **Reading** (``rayjobs queue``, ``status`` and ``list`` of a waiting job, a follower waiting for its
  turn): the queue's keeper writes what it sees to ``rayjobs-queue.json`` in the head node's Ray log
  folder at every change, and Ray's own log API serves that file. One request, no process started.
- **Writing** (entering a job, asking for a stop, setting a limit): a helper job on the head node
  (``python -m rayjobs_agent.queue_keeper``, a few seconds) takes the order from its variables, so no
  word of it reaches a shell, and starts the keeper when the cluster has none of this code. The keeper
  deletes finished helper jobs from Ray's table soon after, so that they do not crowd the team's jobs.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from jobs.submission import AGENT_PACKAGE_DIR
from runner.client.jobs_api import wait_until_ended
from runner.errors import ClusterRequestFailed, JobNotFound, NotADashboard
from rayjobs_agent.wire import METADATA_NAME
from rayjobs_agent.queue_keeper import HELPER_ENTRYPOINT, SNAPSHOT_FILE
from rayjobs_agent.queueing import ANSWER_MARKER, HELPER_NAME, order_variables
from rayjobs_agent.wire import METADATA_ENQUEUES, METADATA_PRIORITY, METADATA_QUEUED_ID

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi

HELPER_WAIT_S = 120.0
class ClusterQueue:
    """The queue of the cluster that ``api`` reaches."""

    def __init__(self, api: JobsApi) -> None:
        self.api = api
        self._head_node: str | None = None

    def snapshot(self) -> dict[str, Any] | None:
        """What the keeper published last (``queues``: each queue's limit, running and waiting jobs); None when the
        cluster has never had a keeper."""
        try:
            node = self._head_node or self._find_head_node()
            query = urllib.parse.urlencode({"node_id": node, "filename": SNAPSHOT_FILE, "lines": -1})
            body = self.api.get_raw(f"/api/v0/logs/file?{query}")
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
        """Where job ``job_id`` waits (``queue``, ``position``, ``reason``, …), or None when it waits in none."""
        for queue in ((snapshot if snapshot is not None else self.snapshot()) or {}).get("queues") or []:
            for job in queue.get("waiting") or []:
                if job.get("id") == job_id:
                    return {**job, "queue": queue.get("queue"), "max_running": queue.get("max_running"),
                            "running": len(queue.get("running") or [])}
        return None

    def waiting_jobs(self, snapshot: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every waiting job, each with its ``queue``, in the order of its queue."""
        return [{**job, "queue": queue.get("queue")}
                for queue in ((snapshot if snapshot is not None else self.snapshot()) or {}).get("queues") or []
                for job in queue.get("waiting") or []]

    def enqueue(self, request: dict[str, Any], *, queue: str, priority: int, needs: dict[str, float], name: str,
                agent_modules: list[str]) -> dict[str, Any]:
        """Enter job request ``request`` (its body as Ray's client sends it, packages uploaded) into ``queue``.

        Returns:
            The helper's answer: ``{"queued", "position", …}``, or ``{"exists": "ray"|"queue", "metadata"}`` when a
            job of that id is already waiting or in Ray's table.
        """
        runtime_env = request.get("runtime_env") or {}
        packages = [uri for uri in [runtime_env.get("working_dir"), *(runtime_env.get("py_modules") or [])]
                    if isinstance(uri, str) and uri.startswith("gcs://")]
        order = {"verb": "enqueue", "queue": queue, "id": request["submission_id"], "name": name,
                 "priority": priority, "needs": needs, "request": request, "packages": packages,
                 "agent_modules": agent_modules}
        metadata = {METADATA_ENQUEUES: queue, METADATA_PRIORITY: str(priority),
                    METADATA_QUEUED_ID: request["submission_id"]}
        return self._run_helper(order, metadata)

    def stop(self, job_id: str) -> dict[str, Any]:
        """Ask the keeper to stop job ``job_id`` (taken out of its queue, or stopped by Ray once it runs)."""
        return self._run_helper({"verb": "stop", "id": job_id})

    def set_limit(self, queue: str, max_running: int | None) -> list[dict[str, Any]]:
        """Set (None: remove) ``queue``'s limit on the cluster; the queue as it is now."""
        return self._run_helper({"verb": "set", "queue": queue, "max_running": max_running})

    def _find_head_node(self) -> str:
        query = urllib.parse.urlencode({"filter_keys": "is_head_node", "filter_predicates": "=",
                                        "filter_values": "True"})
        nodes = (self.api.get_json(f"/api/v0/nodes?{query}").get("data") or {}).get("result", {}).get("result") or []
        if not nodes:
            raise ClusterRequestFailed("the cluster named no head node")
        self._head_node = str(nodes[0]["node_id"])
        return self._head_node

    def _run_helper(self, order: dict[str, Any], metadata: dict[str, str] | None = None) -> Any:
        """Run one order as a helper job on the head node; its answer (a RayJobsError when it has none)."""
        submission = {"entrypoint": HELPER_ENTRYPOINT,
                      "runtime_env": {"py_modules": [str(AGENT_PACKAGE_DIR)], "env_vars": order_variables(order)},
                      "entrypoint_resources": {"node:__internal_head__": 0.001},
                      "metadata": {METADATA_NAME: HELPER_NAME, **(metadata or {})}}
        job_id = self.api.submit(submission)
        status, ended = wait_until_ended(self.api, job_id, within_s=HELPER_WAIT_S, poll_s=0.2)
        log = self.api.job_log(job_id) if ended else ""
        answer = next((line[len(ANSWER_MARKER):] for line in reversed(log.splitlines())
                       if line.startswith(ANSWER_MARKER)), None)
        found = json.loads(answer) if answer is not None else None
        if found is None or (isinstance(found, dict) and "error" in found):
            tail = "\n".join(log.splitlines()[-5:])
            problem = found["error"] if isinstance(found, dict) else f"job {job_id} ended {status or 'not in time'}"
            raise ClusterRequestFailed(f"the cluster's queue could not be reached: {problem}"
                                       + (f"; its log ends:\n{tail}" if tail and found is None else ""))
        return found


def stop_job(api: JobsApi, job_id: str) -> str:
    """Stop a job wherever it is: running (Ray stops it) or waiting in a queue (its keeper takes it out).

    Returns:
        ``"stopped"`` (a stop was asked of Ray), ``"queued"`` (asked of the queue) or ``"ended"`` (nothing to stop).

    Raises:
        JobNotFound: neither Ray nor any queue knows the job.
    """
    try:
        return "stopped" if api.stop_job(job_id) else "ended"
    except JobNotFound:
        queue = ClusterQueue(api)
        if queue.place_of(job_id) is None:
            raise
        queue.stop(job_id)
        return "queued"


__all__ = ["ClusterQueue", "stop_job"]
