"""A deleted job stays deleted, even when Ray's job manager writes its record back."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from runner.client.jobs_api import JobsApi
from runner.client.connection import Connection
from tests.support.cli import loopback_http_server, send_body

JOB_ID = "raysubmit_ended"


class _JobManager(http.server.BaseHTTPRequestHandler):
    """Ray's job API for one job, with its monitor loop's habit: a record deleted before the
    loop's next check is written back as FAILED (JOB_SUPERVISOR_ACTOR_DIED) a moment later."""

    state: dict

    def do_GET(self):  # noqa: N802 - the name http.server calls
        self.state["gets"] += 1
        record = self.state["record"]
        self._answer(200, record) if record else self._answer(404, None, f"Job {JOB_ID} does not exist")

    def do_DELETE(self):  # noqa: N802
        self.state["deletes"] += 1
        self.state["record"] = None
        if self.state["deletes"] == 1 and self.state["recreate_after_s"] is not None:
            threading.Timer(self.state["recreate_after_s"], self._recreate).start()
        self._answer(200, {"deleted": True})

    def _recreate(self):
        self.state["record"] = {"status": "FAILED", "entrypoint": "Entrypoint not found.",
                                "error_type": "JOB_SUPERVISOR_ACTOR_DIED"}

    def _answer(self, code, payload, text=""):
        send_body(self, code, json.dumps(payload).encode() if payload is not None else text.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def job_manager():
    state = {"record": {"status": "STOPPED"}, "gets": 0, "deletes": 0, "recreate_after_s": None}
    with loopback_http_server(type("Handler", (_JobManager,), {"state": state})) as url:
        yield JobsApi(Connection(address=url, source="test")), state


def test_record_written_back_after_a_fresh_stop_is_deleted_again(job_manager):
    api, state = job_manager
    state["recreate_after_s"] = 1.0
    api.delete_finished_job(JOB_ID, end_time_ms=int(time.time() * 1000))
    assert state["deletes"] == 2
    assert state["record"] is None


def test_job_that_ended_long_ago_is_deleted_without_waiting(job_manager):
    api, state = job_manager
    api.delete_finished_job(JOB_ID, end_time_ms=int((time.time() - 3600) * 1000))
    assert (state["deletes"], state["gets"]) == (1, 0)  # deleted once, and never watched for a write-back
