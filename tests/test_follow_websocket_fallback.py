"""A cluster without the state API: the follower falls back to the job API's log websocket.

The seam faked here is the dashboard itself (an aiohttp server on 127.0.0.1): it answers
404 on ``/api/v0/logs/…`` as a Ray without the state API would, and its log websocket
closes early and replays the log from its start on every connection, as Ray's does.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from runner.client.jobs_api import JobsApi
from runner.client.connection import Connection
from runner.follow.follower import Follower

JOB_ID = "raysubmit_fallback"
LOG = "line 0\nline 1\nline 2\nline 3 caf\u00e9\n"


class FakeDashboard:
    """Status RUNNING for a few polls, then SUCCEEDED; each websocket sends one more line of the log, then closes."""

    def __init__(self) -> None:
        self.status_polls = 0
        self.sockets = 0
        self.state_api_calls = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(f"/api/jobs/{JOB_ID}", self.job)
        app.router.add_get(f"/api/jobs/{JOB_ID}/logs", self.logs)
        app.router.add_get(f"/api/jobs/{JOB_ID}/logs/tail", self.tail)
        app.router.add_get("/api/v0/logs/{media}", self.no_state_api)
        return app

    async def job(self, request: web.Request) -> web.Response:
        self.status_polls += 1
        status = "SUCCEEDED" if self.sockets >= 3 else "RUNNING"
        return web.json_response({"submission_id": JOB_ID, "status": status, "driver_node_id": "node-1",
                                  "start_time": 1, "end_time": 2 if status == "SUCCEEDED" else None})

    async def logs(self, request: web.Request) -> web.Response:
        return web.json_response({"logs": LOG})

    async def tail(self, request: web.Request) -> web.WebSocketResponse:
        self.sockets += 1
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        for line in LOG.splitlines(keepends=True)[:self.sockets]:
            await ws.send_str(line)
        await ws.close()
        return ws

    async def no_state_api(self, request: web.Request) -> web.Response:
        self.state_api_calls += 1
        return web.Response(status=404, text="404: Not Found")


@pytest.fixture
def dashboard() -> Iterator[tuple[FakeDashboard, str]]:
    fake = FakeDashboard()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_without_the_state_api_the_websocket_is_followed_and_replays_are_skipped(dashboard):
    fake, address = dashboard
    out, notes = io.StringIO(), io.StringIO()
    outcome = Follower(JobsApi(Connection(address=address, source="test")), JOB_ID, logs_out=out, notes=notes,
                       give_up_after_s=10).run()
    assert outcome.status == "SUCCEEDED", notes.getvalue()
    assert out.getvalue() == LOG, notes.getvalue()
    assert fake.state_api_calls == 1  # asked once, then the websocket for the rest of the job
    assert fake.sockets >= 3  # the log websocket really closed early and was reopened
