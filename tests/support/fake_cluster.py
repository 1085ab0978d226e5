"""A scripted stand-in for the cluster client (``runner.client.jobs_api.JobsApi``), for tests that need no cluster.

Each submitted job plays a script: the statuses its successive status polls return (the last one
repeats). ``calls`` records every call in order, so a test can assert exactly what was asked.

The cluster has a queue keeper, as a cluster rayjobs has submitted to does: an order job is answered at once
(``orders`` keeps them apart from the jobs in ``submitted``), and a job that ends lost whole is submitted again
by the keeper's own rule (``rayjobs_agent.queue.lost_jobs.decision_for_lost_job``), with the next script, its
decision published where a follower reads it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from rayjobs_agent.queue.lost_jobs import decision_for_lost_job, retried_request
from rayjobs_agent.queueing import ORDER_PREFIX, answer_text, order_from
from rayjobs_agent.wire import METADATA_ATTEMPT, METADATA_SPEC_HASH
from runner.client.connection import Connection
from runner.errors import ClusterRequestFailed, ClusterUnreachable, JobNotFound
from runner.client.log_resume import LogChunk, ResumePlan
from runner.client.submission import SubmitInterrupted

FAKE_ADDRESS = "http://127.0.0.1:8265"
AN_HOUR_AGO_MS = (time.time() - 3600) * 1000


@dataclass
class Script:
    """How one job behaves: statuses, one per status poll (the last repeats), and what it printed."""

    statuses: list[str] = field(default_factory=lambda: ["RUNNING", "SUCCEEDED"])
    log: bytes = b""
    error_type: str | None = None
    message: str = ""
    driver_exit_code: int | None = None
    start_time: float | None = None  # ms; None: when it was submitted
    # Raised by the status poll with this index (0 is the first), e.g. KeyboardInterrupt.
    raise_on_poll: dict[int, BaseException] = field(default_factory=dict)
    # From this status poll on, the cluster no longer answers.
    unreachable_from_poll: int | None = None


class FakeClient:
    """Answers like ``JobsApi``; jobs are submitted with ``Script``s taken in turn from ``scripts``."""

    def __init__(self, *scripts: Script, connection: Connection | None = None) -> None:
        self.connection = connection or Connection(address=FAKE_ADDRESS, source="--address")
        self.scripts = list(scripts)
        self.calls: list[tuple[Any, ...]] = []
        self.submitted: list[dict[str, Any]] = []
        self.records: dict[str, dict[str, Any]] = {}
        self._plays: dict[str, tuple[Script, int]] = {}
        self.nodes: list[dict[str, float]] = [{"CPU": 2.0, "memory": 8 * 2**30}]
        self.autoscaler = False
        self.submit_error: BaseException | None = None
        self.get_job_error: BaseException | None = None
        self.stop_error: BaseException | None = None
        # Ctrl-C right after the job request went out, before its answer came back.
        self.interrupt_after_request = False
        # The order jobs the client sent the cluster's queue, and what its keeper decided about jobs lost whole.
        self.orders: list[dict[str, Any]] = []
        self.decisions: dict[str, dict[str, Any]] = {}
        self.keeper = True
        # Looks at the keeper's snapshot that do not show its decisions yet; and whether the keeper is still in a
        # retry's backoff (it submits nothing) instead of submitting the next attempt at once.
        self.decisions_hidden_for_looks = 0
        self.in_backoff = False

    @property
    def address(self) -> str:
        return self.connection.address

    def existing(self, job_id: str, script: Script, metadata: dict[str, str]) -> None:
        """A job that is already on the cluster (submitted earlier, maybe by someone else)."""
        self._start(job_id, script, {"submission_id": job_id, "metadata": metadata})

    # The client's methods ------------------------------------------------------------

    def submit(self, submission: dict[str, Any], *, warn: Any = None, progress: Any = None) -> str:
        self.calls.append(("submit", submission.get("submission_id")))
        if self.submit_error is not None:
            raise self.submit_error
        if str(submission.get("submission_id") or "").startswith(ORDER_PREFIX):
            return self._order(submission)
        job_id = submission.get("submission_id") or f"raysubmit_fake{len(self.submitted) + 1}"
        self.submitted.append(submission)
        self._start(job_id, self.scripts.pop(0) if self.scripts else Script(), submission)
        if self.interrupt_after_request:
            raise SubmitInterrupted(job_id)
        return job_id

    def get_job(self, job_id: str) -> dict[str, Any]:
        self.calls.append(("get_job", job_id))
        if job_id not in self.records:
            raise JobNotFound(f"no job {job_id!r} on the cluster at {self.address}")
        script, polls = self._plays[job_id]
        self._plays[job_id] = (script, polls + 1)
        if polls in script.raise_on_poll:
            raise script.raise_on_poll[polls]
        if script.unreachable_from_poll is not None and polls >= script.unreachable_from_poll:
            raise ClusterUnreachable(f"cannot reach the Ray dashboard at {self.address}: Connection refused")
        if self.get_job_error is not None:
            raise self.get_job_error
        record = self.records[job_id]
        if record["status"] != "STOPPED":
            record["status"] = script.statuses[min(polls, len(script.statuses) - 1)]
        if record["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            record.setdefault("end_time", record["start_time"] + 1500)
            if record["status"] == "FAILED" and "error_type" not in record:
                record.update(error_type=script.error_type, message=script.message,
                              driver_exit_code=script.driver_exit_code)
                self._keeper_sees_failure(job_id)
        return dict(record)

    def stop_job(self, job_id: str) -> bool:
        self.calls.append(("stop_job", job_id))
        if self.stop_error is not None:
            raise self.stop_error
        if job_id not in self.records:
            raise JobNotFound(f"no job {job_id!r} on the cluster at {self.address}")
        record = self.records[job_id]
        if record["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            return False
        record["status"] = "STOPPED"
        return True

    def list_jobs(self) -> list[dict[str, Any]]:
        self.calls.append(("list_jobs",))
        return [dict(record) for record in self.records.values()]

    def get_json(self, path: str) -> Any:
        """The state API a cluster queue is read through: one head node."""
        self.calls.append(("get_json", path))
        if not self.keeper:
            raise ClusterRequestFailed("no queue's keeper has published on this cluster")
        return {"data": {"result": {"result": [{"node_id": "head-node"}]}}}

    def get_raw(self, path: str) -> bytes:
        """The keeper's published snapshot: no queue, and its decisions about jobs lost whole."""
        self.calls.append(("get_raw", path))
        if not self.keeper:
            raise ClusterRequestFailed("no queue's keeper has published on this cluster")
        if self.decisions_hidden_for_looks > 0:
            self.decisions_hidden_for_looks -= 1
            return json.dumps({"at": time.time(), "queues": [], "retries": {}}).encode()
        return json.dumps({"at": time.time(), "queues": [], "retries": self.decisions}).encode()

    def node_resources(self) -> list[dict[str, float]]:
        self.calls.append(("node_resources",))
        return self.nodes

    def has_autoscaler(self) -> bool:
        return self.autoscaler

    def job_log(self, job_id: str, tail: int | None = None, driver_node_id: str | None = None) -> str:
        self.calls.append(("job_log", job_id, tail))
        self.get_job(job_id)
        text = self._plays[job_id][0].log.decode("utf-8", "replace")
        return "".join(text.splitlines(keepends=True)[-tail:]) if tail else text

    def get_logs(self, job_id: str) -> str:
        self.calls.append(("get_logs", job_id))
        return self._plays[job_id][0].log.decode("utf-8", "replace")

    async def tail_job_logs(self, job_id: str, *, node_id: str, resume: ResumePlan,
                            follow: bool = True) -> AsyncIterator[LogChunk]:
        # Small logs only: the follower replays them from byte 0 and skips what it printed.
        yield LogChunk(self._plays[job_id][0].log, 0)

    async def tail_job_logs_websocket(self, job_id: str) -> AsyncIterator[LogChunk]:
        yield LogChunk(self._plays[job_id][0].log, 0)

    def _start(self, job_id: str, script: Script, submission: dict[str, Any]) -> None:
        self._plays[job_id] = (script, 0)
        self.records[job_id] = {
            "submission_id": job_id, "status": "PENDING", "driver_node_id": "node-1",
            "entrypoint": submission.get("entrypoint", ""), "metadata": dict(submission.get("metadata") or {}),
            "start_time": script.start_time or time.time() * 1000,
            "runtime_env": dict(submission.get("runtime_env") or {}),
        }

    def _order(self, submission: dict[str, Any]) -> str:
        """An order job, answered at once by the cluster's keeper (it never runs)."""
        order_id = submission["submission_id"]
        if order_id in self.records:
            raise ClusterRequestFailed(f"Job with submission_id {order_id} already exists.")
        order = order_from((submission.get("runtime_env") or {}).get("env_vars") or {})
        self.orders.append(order)
        answer: Any = {"keeper": "fake"}
        if order.get("verb") == "stop":
            job_id = str(order["id"])
            decided = self.decisions.get(job_id)
            if decided is not None and decided.get("retry"):
                decided["retry"], answer = False, {"stopped": job_id, "was": "waiting to be submitted again"}
            else:
                answer = {"unknown": job_id}
        self._plays[order_id] = (Script(["STOPPED"]), 0)
        self.records[order_id] = {"submission_id": order_id, "status": "STOPPED", "message": answer_text(answer),
                                  "metadata": dict(submission.get("metadata") or {}), "start_time": time.time() * 1000}
        return order_id

    def _keeper_sees_failure(self, job_id: str) -> None:
        """What the cluster's keeper does when a job of rayjobs ends FAILED: submit it again if it was lost whole."""
        record = self.records[job_id]
        if not self.keeper or METADATA_SPEC_HASH not in record["metadata"]:
            return
        attempts = int(record["metadata"].get(METADATA_ATTEMPT) or 1)
        decided = decision_for_lost_job(job_id, record, attempts, time.time(),
                                        lambda other: (self.records.get(other) or {}).get("status"))
        if decided is None:
            return
        self.decisions[job_id] = decided
        if decided["retry"]:
            request = retried_request(record, decided["next"], decided["attempt"], decided["first"])
            if not self.in_backoff:
                self._submit_next(request)

    def _submit_next(self, request: dict[str, Any]) -> None:
        self.submitted.append(request)
        self._start(request["submission_id"], self.scripts.pop(0) if self.scripts else Script(), request)

    def called(self, name: str) -> list[tuple[Any, ...]]:
        """The calls of one method, in order."""
        return [call for call in self.calls if call[0] == name]


def speed_up_following(monkeypatch: pytest.MonkeyPatch) -> None:
    """Poll, reconnect and retry every few milliseconds instead of every fraction of a second; no retry_backoff."""
    from runner.follow import follower as follow
    from runner.run import retry_policy

    for name in ("FIRST_POLL_S", "MAX_POLL_S", "MAX_RETRY_S", "FIRST_LOG_RECONNECT_S", "MAX_LOG_RECONNECT_S"):
        monkeypatch.setattr(follow, name, 0.005)
    monkeypatch.setattr(retry_policy, "sleep", lambda _seconds: None)
